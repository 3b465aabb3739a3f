//! The TCP proxy tests cut for database outages and API-server partitions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// A TCP proxy on loopback owned by a test, to cut a connection path (a database outage or a
/// partition) without disturbing the server other tests share.
pub struct Proxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    stalled: Arc<AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    /// Connections accepted while stalled (held, never answered): evidence a stall was hit.
    held: Arc<AtomicU64>,
    /// What a proxy made with [`Proxy::start_shaping`] does to the traffic it forwards.
    shaping: Arc<Shaping>,
    task: tokio::task::JoinHandle<()>,
}

/// Server bytes that come this long after the client last wrote on the connection were pushed,
/// not asked for: a watch event (one request, then events for minutes), not the answer to a
/// request (the local API server answers within milliseconds; one slower than this under load
/// is delayed too, and a controller's Lease renewal that slow would miss its 3 s deadline
/// anyway).
const PUSH_GAP: Duration = Duration::from_secs(2);

/// What a shaping proxy ([`Proxy::start_shaping`]) does to the bytes it forwards, changed while
/// it runs.
struct Shaping {
    /// What the server pushes is delayed by this many milliseconds (0: not delayed).
    delay_ms: AtomicU64,
    /// Chunks the server pushed that were delayed: evidence a delay was applied.
    delayed: AtomicU64,
    /// The client's bytes are held (in order, per connection) while true, then sent.
    hold: tokio::sync::watch::Sender<bool>,
    /// Chunks of the client's that came while held: evidence something was held.
    held: AtomicU64,
    /// Connections on which the client sent something while held.
    held_conns: AtomicU64,
    /// Of those, connections on which the server answered after the hold was released: it
    /// received what was held, in order, and answered it.
    answered_conns: AtomicU64,
}

impl Proxy {
    /// Forwards `127.0.0.1:<port>` to `target` while up.
    pub async fn start(target: std::net::SocketAddr) -> Result<Proxy> {
        Proxy::start_with(target, false).await
    }

    /// [`Proxy::start`], able to delay what the server pushes ([`Proxy::delay_pushed`]: a
    /// client's watches lag while its requests are answered at once) and to hold what the
    /// client sends ([`Proxy::hold_requests`]: its requests reach the server late).
    pub async fn start_shaping(target: std::net::SocketAddr) -> Result<Proxy> {
        Proxy::start_with(target, true).await
    }

    async fn start_with(target: std::net::SocketAddr, shaped: bool) -> Result<Proxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let up = Arc::new(AtomicBool::new(true));
        let stalled = Arc::new(AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let held = Arc::new(AtomicU64::new(0));
        let shaping = Arc::new(Shaping {
            delay_ms: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
            hold: tokio::sync::watch::channel(false).0,
            held: AtomicU64::new(0),
            held_conns: AtomicU64::new(0),
            answered_conns: AtomicU64::new(0),
        });
        let (up2, stalled2, gen2) = (up.clone(), stalled.clone(), generation.clone());
        let (held2, shaping2) = (held.clone(), shaping.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                if stalled2.load(Ordering::SeqCst) {
                    // Accepted, never answered: a server that hangs.
                    held2.fetch_add(1, Ordering::SeqCst);
                    let mut cut = gen2.subscribe();
                    tokio::spawn(async move {
                        let _held = inbound;
                        let _ = cut.changed().await;
                    });
                    continue;
                }
                let mut cut = gen2.subscribe();
                let shaping = shaping2.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    if shaped {
                        tokio::select! {
                            _ = pump_shaped(inbound, outbound, shaping) => {}
                            _ = cut.changed() => {}
                        }
                        return;
                    }
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {} // taken down: both ends are dropped
                    }
                });
            }
        });
        Ok(Proxy {
            port,
            up,
            stalled,
            generation,
            held,
            shaping,
            task,
        })
    }

    /// How many connections were accepted while stalled, so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }

    /// Refuses new connections and cuts the open ones.
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
    }

    /// Delays what the server pushes on each connection (bytes that come more than `PUSH_GAP`
    /// after the client last wrote: watch events) by `delay`, in order; None: no delay. Answers
    /// to requests pass at once. Only for a proxy made with [`Proxy::start_shaping`].
    pub fn delay_pushed(&self, delay: Option<Duration>) {
        let ms = delay.map_or(0, |d| d.as_millis() as u64);
        self.shaping.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// How many pushed chunks were delayed, so far.
    pub fn delayed(&self) -> u64 {
        self.shaping.delayed.load(Ordering::SeqCst)
    }

    /// Holds what the client sends (true), in order on each connection, without closing
    /// anything: requests already written reach the server only once released (false), as
    /// through a network that delays them. Only for a proxy made with [`Proxy::start_shaping`].
    pub fn hold_requests(&self, on: bool) {
        self.shaping.hold.send_replace(on);
    }

    /// How many chunks the client sent while its requests were held, so far.
    pub fn held_requests(&self) -> u64 {
        self.shaping.held.load(Ordering::SeqCst)
    }

    /// (connections on which something was held, those of them the server answered on after
    /// the hold was released): once equal, the server has received everything held.
    pub fn held_answered(&self) -> (u64, u64) {
        (
            self.shaping.held_conns.load(Ordering::SeqCst),
            self.shaping.answered_conns.load(Ordering::SeqCst),
        )
    }

    /// Accepts connections but never answers (a hung server); cuts the open ones.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Forwards one connection as [`Shaping`] says. The client's bytes stamp when it last wrote and
/// go to the server at once, or once released while held; each chunk from the server is
/// released at once if the client wrote within [`PUSH_GAP`] (an answer), else `delay_ms` later.
/// Each direction keeps its order. Ends when both directions have.
async fn pump_shaped(
    inbound: tokio::net::TcpStream,
    outbound: tokio::net::TcpStream,
    shaping: Arc<Shaping>,
) {
    let (client_rx, client_tx) = inbound.into_split();
    let (server_rx, server_tx) = outbound.into_split();
    let hold = shaping.hold.subscribe();
    let conn = Arc::new(Shaped {
        shaping,
        last_write: std::sync::Mutex::new(Instant::now()),
        held_here: AtomicBool::new(false),
        answered_here: AtomicBool::new(false),
    });
    let (up_tx, up_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let (down_tx, down_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::join!(
        read_up(client_rx, up_tx, conn.clone()),
        write_up(server_tx, up_rx, hold),
        read_down(server_rx, down_tx, conn),
        write_down(client_tx, down_rx),
    );
}

/// What the halves of one shaped connection share.
struct Shaped {
    shaping: Arc<Shaping>,
    /// When the client last wrote.
    last_write: std::sync::Mutex<Instant>,
    /// Something was held on this connection.
    held_here: AtomicBool,
    /// The server answered on it after the release.
    answered_here: AtomicBool,
}

/// The client's bytes, stamped and counted when held, to [`write_up`].
async fn read_up(
    mut client_rx: tokio::net::tcp::OwnedReadHalf,
    up_tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    conn: Arc<Shaped>,
) {
    let shaping = &conn.shaping;
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = client_rx.read(&mut buf).await {
        if n == 0 {
            break;
        }
        *conn
            .last_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        if *shaping.hold.borrow() {
            shaping.held.fetch_add(1, Ordering::SeqCst);
            if !conn.held_here.swap(true, Ordering::SeqCst) {
                shaping.held_conns.fetch_add(1, Ordering::SeqCst);
            }
        }
        if up_tx.send(buf[..n].to_vec()).is_err() {
            break;
        }
    }
}

/// The client's bytes to the server, in order; while held, once released.
async fn write_up(
    mut server_tx: tokio::net::tcp::OwnedWriteHalf,
    mut up_rx: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    mut hold: tokio::sync::watch::Receiver<bool>,
) {
    while let Some(bytes) = up_rx.recv().await {
        if hold.wait_for(|h| !*h).await.is_err() {
            break;
        }
        if server_tx.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = server_tx.shutdown().await;
}

/// The server's bytes, each with the time it may reach the client: at once for an answer (the
/// client wrote within [`PUSH_GAP`]), else `delay_ms` later (a pushed watch event).
async fn read_down(
    mut server_rx: tokio::net::tcp::OwnedReadHalf,
    down_tx: tokio::sync::mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    conn: Arc<Shaped>,
) {
    let shaping = &conn.shaping;
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = server_rx.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let now = Instant::now();
        if conn.held_here.load(Ordering::SeqCst)
            && !*shaping.hold.borrow()
            && !conn.answered_here.swap(true, Ordering::SeqCst)
        {
            shaping.answered_conns.fetch_add(1, Ordering::SeqCst);
        }
        let wrote = *conn
            .last_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ms = shaping.delay_ms.load(Ordering::SeqCst);
        let at = if ms > 0 && now.duration_since(wrote) > PUSH_GAP {
            shaping.delayed.fetch_add(1, Ordering::SeqCst);
            now + Duration::from_millis(ms)
        } else {
            now
        };
        if down_tx.send((at, buf[..n].to_vec())).is_err() {
            break;
        }
    }
}

/// The server's bytes to the client, each at its time, in order.
async fn write_down(
    mut client_tx: tokio::net::tcp::OwnedWriteHalf,
    mut down_rx: tokio::sync::mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
) {
    while let Some((at, bytes)) = down_rx.recv().await {
        tokio::time::sleep_until(at).await;
        if client_tx.write_all(&bytes).await.is_err() {
            break;
        }
    }
    let _ = client_tx.shutdown().await;
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
