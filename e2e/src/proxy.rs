//! The TCP proxy tests cut for database outages and API-server partitions.

use anyhow::Result;

/// A TCP proxy on loopback owned by a test, to cut a connection path (a database outage or a
/// partition) without disturbing the server other tests share.
pub struct Proxy {
    pub port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    generation: tokio::sync::watch::Sender<u64>,
    /// Connections accepted while stalled (held, never answered): evidence a stall was hit.
    held: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards `127.0.0.1:<port>` to `target` while up.
    pub async fn start(target: std::net::SocketAddr) -> Result<Proxy> {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let held = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (up2, stalled2, gen2) = (up.clone(), stalled.clone(), generation.clone());
        let held2 = held.clone();
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
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
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
            task,
        })
    }

    /// How many connections were accepted while stalled, so far.
    pub fn held(&self) -> u64 {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Refuses new connections and cuts the open ones.
    pub fn down(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn up(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stalled
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Accepts connections but never answers (a hung server); cuts the open ones.
    pub fn stall(&self) {
        self.stalled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
