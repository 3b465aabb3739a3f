//! Never send the password to a server nobody verified.
//!
//! tokio-postgres answers whatever authentication the server asks for: a cleartext password, or
//! its MD5 hash (as good as the password: it is what MD5 authentication checks). Over plain TCP,
//! or over TLS without certificate verification (`disable`, `prefer`, `require` without
//! `sslrootcert`), that server may be anyone on the path. The driver has no hook to deny a method
//! (`channel_binding=require` would also refuse `trust` and plain SCRAM, which send no password),
//! so [`AuthGuard`] reads the server's bytes before the driver does: an
//! AuthenticationCleartextPassword (`R`, code 3) or AuthenticationMD5Password (code 5) request
//! fails the read, so the driver never gets to write the answer. SCRAM sends only a proof, never
//! the password, and stays allowed; so does `trust`. Over a verified connection (`verify-ca`,
//! `verify-full`) nothing is inspected.
//!
//! Where the guard sits: on the TCP stream (it sees the reply to SSLRequest; after `S` the rest
//! is TLS and it steps aside) and, for unverified TLS, on the decrypted stream inside TLS
//! ([`GuardedTls`]). After AuthenticationOk it only passes bytes through.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, TlsConnect, TlsStream};

/// Authentication request codes (the `R` message's first field) that would send the password.
const CLEARTEXT: u32 = 3;
const MD5: u32 = 5;

/// Which password request was refused (0: none; [`NOT_POSTGRES`]: the server is not speaking
/// PostgreSQL), shared between the guards of one connection and the code that reports the failure.
pub(crate) type Refused = Arc<AtomicU32>;

/// Recorded in [`Refused`] when the server's first bytes are no PostgreSQL reply (an HTTP server
/// at that port, say); the driver's own error for that ("bytes remaining on stream") says little.
pub(crate) const NOT_POSTGRES: u32 = u32::MAX;

/// The text for a server that does not speak PostgreSQL.
pub(crate) const NOT_POSTGRES_MESSAGE: &str =
    "the server does not speak the PostgreSQL protocol: check the host and port";

/// The text for a refused request `code`, naming no value from the Secret.
pub(crate) fn refusal_message(code: u32) -> Option<String> {
    let what = match code {
        CLEARTEXT => "a cleartext password",
        MD5 => "an MD5 password hash",
        _ => return None,
    };
    Some(format!(
        "the server asked for {what} over a connection whose server is not verified; the password was not sent (use sslmode verify-full, or verify-ca with sslrootcert, or SCRAM authentication on the server)"
    ))
}

/// Where the scanner is in the server's byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    /// The one-byte reply to SSLRequest: `S` (TLS follows: step aside) or anything else (the
    /// driver then goes on in plain text, as it does).
    SslReply,
    /// A message header: type byte and 4-byte length; `have` bytes read so far.
    Header { have: usize },
    /// The 4-byte code of an `R` message; `rest` is the body length after the code.
    AuthCode { have: usize, rest: usize },
    /// The rest of a message that does not matter.
    Skip { rest: usize },
    /// Authentication is over (or TLS took over): pass everything.
    Done,
    /// A password request was refused: every further read and write fails.
    Refused(u32),
}

/// The pure half of the guard: fed the server's bytes in order, says when to refuse.
#[derive(Debug)]
pub(crate) struct Scanner {
    state: Scan,
    header: [u8; 5],
    code: [u8; 4],
    /// Whether a reply the protocol does not allow before authentication was seen.
    pub(crate) foreign: bool,
}

impl Scanner {
    /// `ssl_request`: the client sends SSLRequest first, so the first byte is its reply.
    pub(crate) fn new(ssl_request: bool) -> Self {
        let state = if ssl_request {
            Scan::SslReply
        } else {
            Scan::Header { have: 0 }
        };
        Scanner {
            state,
            header: [0; 5],
            code: [0; 4],
            foreign: false,
        }
    }

    /// Reads `bytes`; `Err(code)` when they complete a cleartext or MD5 password request.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), u32> {
        while let Some((&b, rest)) = bytes.split_first() {
            match self.state {
                Scan::Done => return Ok(()),
                Scan::Refused(code) => return Err(code),
                Scan::Skip { rest: n } => {
                    let take = n.min(bytes.len());
                    bytes = &bytes[take..];
                    self.state = after_skip(n - take);
                    continue;
                }
                Scan::SslReply => {
                    self.foreign |= b != b'S' && b != b'N';
                    self.state = if b == b'S' {
                        Scan::Done
                    } else {
                        Scan::Header { have: 0 }
                    };
                }
                Scan::Header { have } => {
                    // Before authentication ends: Authentication, ErrorResponse, NoticeResponse,
                    // NegotiateProtocolVersion.
                    self.foreign |= have == 0 && !b"RENv".contains(&b);
                    self.header[have] = b;
                    self.state = if have + 1 < 5 {
                        Scan::Header { have: have + 1 }
                    } else {
                        self.after_header()
                    };
                }
                Scan::AuthCode { have, rest: n } => {
                    self.code[have] = b;
                    self.state = if have + 1 < 4 {
                        Scan::AuthCode {
                            have: have + 1,
                            rest: n,
                        }
                    } else {
                        match u32::from_be_bytes(self.code) {
                            CLEARTEXT => Scan::Refused(CLEARTEXT),
                            MD5 => Scan::Refused(MD5),
                            0 => Scan::Done,
                            _ => after_skip(n),
                        }
                    };
                }
            }
            bytes = rest;
        }
        match self.state {
            Scan::Refused(code) => Err(code),
            _ => Ok(()),
        }
    }

    /// The state after a complete header: `R` messages have their code read, others skipped.
    fn after_header(&self) -> Scan {
        let len = u32::from_be_bytes([
            self.header[1],
            self.header[2],
            self.header[3],
            self.header[4],
        ]);
        // The length counts itself; anything shorter is not PostgreSQL, and the driver will say so.
        let Some(body) = (len as usize).checked_sub(4) else {
            return Scan::Done;
        };
        match self.header[0] {
            b'R' if body >= 4 => Scan::AuthCode {
                have: 0,
                rest: body - 4,
            },
            _ => after_skip(body),
        }
    }
}

fn after_skip(rest: usize) -> Scan {
    if rest == 0 {
        Scan::Header { have: 0 }
    } else {
        Scan::Skip { rest }
    }
}

/// A stream whose incoming bytes pass the [`Scanner`] before the driver sees them.
pub(crate) struct AuthGuard<S> {
    inner: S,
    scanner: Scanner,
    refused: Refused,
}

impl<S> AuthGuard<S> {
    pub(crate) fn new(inner: S, ssl_request: bool, refused: Refused) -> Self {
        AuthGuard {
            inner,
            scanner: Scanner::new(ssl_request),
            refused,
        }
    }

    fn refusal(&self, code: u32) -> io::Error {
        self.refused.store(code, Ordering::Relaxed);
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            refusal_message(code).unwrap_or_default(),
        )
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Scan::Refused(code) = this.scanner.state {
            return Poll::Ready(Err(this.refusal(code)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Err(code) = this.scanner.feed(&buf.filled()[before..]) {
            // The request never reaches the driver, so it never answers it.
            buf.set_filled(before);
            return Poll::Ready(Err(this.refusal(code)));
        }
        if this.scanner.foreign {
            let _ = this.refused.compare_exchange(
                0,
                NOT_POSTGRES,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Scan::Refused(code) = this.scanner.state {
            return Poll::Ready(Err(this.refusal(code)));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: TlsStream + Unpin> TlsStream for AuthGuard<S> {
    fn channel_binding(&self) -> ChannelBinding {
        self.inner.channel_binding()
    }
}

/// A TLS connector whose stream is guarded inside TLS, for the modes that do not verify the
/// server (`None`: verified, pass the inner stream through a guard that is already done).
pub(crate) struct GuardedTls<T> {
    pub(crate) inner: T,
    pub(crate) refused: Option<Refused>,
}

impl<S, T> TlsConnect<S> for GuardedTls<T>
where
    T: TlsConnect<S> + Send + 'static,
    T::Future: Send + 'static,
    S: 'static,
{
    type Stream = AuthGuard<T::Stream>;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Stream, Self::Error>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connecting = self.inner.connect(stream);
        let refused = self.refused;
        Box::pin(async move {
            let tls = connecting.await?;
            Ok(match refused {
                Some(r) => AuthGuard::new(tls, false, r),
                None => {
                    let mut g = AuthGuard::new(tls, false, Refused::default());
                    g.scanner.state = Scan::Done;
                    g
                }
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn auth(code: u32, extra: &[u8]) -> Vec<u8> {
        let mut body = code.to_be_bytes().to_vec();
        body.extend_from_slice(extra);
        msg(b'R', &body)
    }

    /// Every split of `stream` into two reads gives the same verdict.
    fn verdict(ssl_request: bool, stream: &[u8]) -> Result<(), u32> {
        let whole = Scanner::new(ssl_request).feed(stream);
        for cut in 0..=stream.len() {
            let mut s = Scanner::new(ssl_request);
            let split = s.feed(&stream[..cut]).and_then(|()| s.feed(&stream[cut..]));
            assert_eq!(split, whole, "cut at {cut}");
        }
        whole
    }

    #[test]
    fn password_requests_are_refused_wherever_the_reads_split() {
        let notice = msg(b'N', b"SNOTICE\0\0");
        let cleartext = [notice.clone(), auth(CLEARTEXT, &[])].concat();
        assert_eq!(verdict(false, &cleartext), Err(CLEARTEXT));
        let md5 = [b"N".to_vec(), auth(MD5, b"salt")].concat();
        assert_eq!(verdict(true, &md5), Err(MD5));
    }

    #[test]
    fn scram_trust_and_tls_pass() {
        // SASL (10) with its mechanism list, then SASLContinue, SASLFinal, Ok: then session data
        // that happens to look like a password request.
        let scram = [
            auth(10, b"SCRAM-SHA-256\0\0"),
            auth(11, b"r=abc"),
            auth(12, b"v=xyz"),
            auth(0, &[]),
            auth(CLEARTEXT, &[]),
        ]
        .concat();
        assert_eq!(verdict(false, &scram), Ok(()));
        assert_eq!(
            verdict(false, &[auth(0, &[]), auth(MD5, b"salt")].concat()),
            Ok(())
        );
        // After `S` the bytes are TLS records: not inspected at this layer.
        assert_eq!(
            verdict(true, &[b"S".to_vec(), auth(CLEARTEXT, &[])].concat()),
            Ok(())
        );
    }

    #[test]
    fn a_server_that_is_not_postgres_is_noticed() {
        for (ssl, bytes) in [
            (true, &b"HTTP/1.1 400"[..]),
            (false, b"HTTP/1.1 400"),
            (false, b"SSH-2.0"),
        ] {
            let mut s = Scanner::new(ssl);
            assert_eq!(s.feed(bytes), Ok(()));
            assert!(s.foreign, "{bytes:?}");
        }
        let mut s = Scanner::new(true);
        s.feed(&[b"N".to_vec(), auth(10, b"SCRAM-SHA-256\0\0")].concat())
            .unwrap();
        assert!(!s.foreign);
    }
}
