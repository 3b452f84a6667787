//! Requesters and the worker threads that drive them. Each requester is a closed loop with one
//! outstanding request on its own socket; a worker multiplexes its requesters with `poll`, so an
//! idle worker sleeps instead of spinning.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::Rng;

use crate::frame::{DropReason, Header, Push, Reassembly, HEADER_LEN};
use crate::poll::{self, PollFd};
use crate::report::Stats;
use crate::text::{self, Op, Outcome};
use crate::zipf::KeyGen;
use crate::Proto;

/// How long a TCP (re)connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause before reconnecting after a failed TCP connect.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
/// Upper bound on one `poll` so the stop conditions are checked regularly.
const MAX_WAIT: Duration = Duration::from_millis(100);
/// Large enough for any UDP datagram and a good chunk of a TCP reply.
const RECV_BUF: usize = 65_536;

/// Everything the workers share; read-only apart from the counters.
pub struct Plan {
    pub target: SocketAddr,
    pub key_prefix: String,
    pub keygen: KeyGen,
    pub get_ratio: f64,
    pub value: Vec<u8>,
    pub timeout: Duration,
    /// Requests issued before this instant are warm-up and not counted.
    pub measure_start: Instant,
    pub end: Instant,
    /// Cap on measured requests.
    pub cap: Option<u64>,
    /// Measured requests issued so far, across all workers.
    pub issued: AtomicU64,
    /// Replies and timeouts so far, warm-up included; read by the progress line.
    pub completed: AtomicU64,
}

enum Conn {
    Udp {
        sock: UdpSocket,
        next_id: u16,
        reassembly: Reassembly,
    },
    Tcp {
        stream: Option<TcpStream>,
        rbuf: Vec<u8>,
    },
}

#[derive(Clone, Copy)]
enum State {
    Idle,
    Waiting {
        op: Op,
        sent: Instant,
        measured: bool,
    },
    /// TCP connection lost; reconnect at this instant.
    Down(Instant),
}

/// One closed-loop client.
pub struct Requester {
    conn: Conn,
    rng: SmallRng,
    state: State,
    req: Vec<u8>,
}

impl Requester {
    /// Opens the requester's socket: a connected UDP socket, or a TCP connection with
    /// `TCP_NODELAY`.
    pub fn connect(
        proto: Proto,
        target: SocketAddr,
        mut rng: SmallRng,
    ) -> anyhow::Result<Requester> {
        let conn = match proto {
            Proto::Udp => {
                let sock = udp_socket(target)?;
                sock.set_nonblocking(true)
                    .context("failed to make UDP socket non-blocking")?;
                Conn::Udp {
                    sock,
                    // A random first id makes replies meant for an earlier run's socket on
                    // the same port unlikely to match.
                    next_id: rng.gen(),
                    reassembly: Reassembly::default(),
                }
            }
            Proto::Tcp => Conn::Tcp {
                stream: Some(tcp_connect(target)?),
                rbuf: Vec::new(),
            },
        };
        Ok(Requester {
            conn,
            rng,
            state: State::Idle,
            req: Vec::with_capacity(256),
        })
    }
}

/// A UDP socket bound to an ephemeral port of the target's address family and connected to the
/// target, so only its datagrams are received.
pub fn udp_socket(target: SocketAddr) -> anyhow::Result<UdpSocket> {
    let local: SocketAddr = if target.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = UdpSocket::bind(local).context("failed to bind UDP socket")?;
    sock.connect(target)
        .with_context(|| format!("failed to connect UDP socket to {target}"))?;
    Ok(sock)
}

/// A blocking TCP connection with `TCP_NODELAY`. Reads are only issued after `poll` reports
/// the socket readable; the timeouts are a safety net.
pub fn tcp_connect(target: SocketAddr) -> anyhow::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT)
        .with_context(|| format!("failed to connect to {target} over TCP"))?;
    s.set_nodelay(true).context("failed to set TCP_NODELAY")?;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .context("failed to set read timeout")?;
    s.set_write_timeout(Some(Duration::from_secs(1)))
        .context("failed to set write timeout")?;
    Ok(s)
}

/// Rounds up to whole microseconds, so any real reply records at least 1 µs.
fn micros(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1000).min(u128::from(u64::MAX)) as u64
}

/// Runs `requesters` until the plan's end, or until the request cap is reached and every
/// outstanding request finished. Returns the measured counters and when the worker stopped.
pub fn run(plan: &Plan, mut requesters: Vec<Requester>) -> (Stats, Instant) {
    let mut w = Worker {
        plan,
        stats: Stats::default(),
        scratch: vec![0u8; RECV_BUF],
        capped: false,
        done: 0,
    };
    let mut fds: Vec<PollFd> = Vec::with_capacity(requesters.len());
    let mut owners: Vec<usize> = Vec::with_capacity(requesters.len());
    loop {
        let now = Instant::now();
        if now >= plan.end {
            return (w.stats, plan.end);
        }
        let mut next = plan.end.min(now + MAX_WAIT);
        fds.clear();
        owners.clear();
        for (i, r) in requesters.iter_mut().enumerate() {
            if let State::Down(at) = r.state {
                if now >= at {
                    w.reconnect(r, now);
                }
            }
            if matches!(r.state, State::Idle) && !w.capped {
                w.issue(r);
            }
            match r.state {
                State::Waiting { sent, .. } => {
                    if matches!(r.conn, Conn::Udp { .. }) {
                        next = next.min(sent + plan.timeout);
                    }
                    if let Some(fd) = r.raw_fd() {
                        fds.push(PollFd::readable(fd));
                        owners.push(i);
                    }
                }
                State::Down(at) => next = next.min(at),
                State::Idle => {}
            }
        }
        if w.capped && fds.is_empty() {
            return (w.stats, Instant::now());
        }
        let wait = next.saturating_duration_since(Instant::now());
        if fds.is_empty() {
            std::thread::sleep(wait);
        } else if poll::wait(&mut fds, wait).is_err() {
            // poll only fails on resource exhaustion; back off rather than spin.
            std::thread::sleep(Duration::from_millis(1));
        }
        for (fd, &i) in fds.iter().zip(&owners) {
            if fd.ready() {
                w.receive(&mut requesters[i]);
            }
        }
        let now = Instant::now();
        for r in requesters.iter_mut() {
            w.check_timeout(r, now);
        }
        if w.done > 0 {
            plan.completed.fetch_add(w.done, Ordering::Relaxed);
            w.done = 0;
        }
    }
}

impl Requester {
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.conn {
            Conn::Udp { sock, .. } => Some(sock.as_raw_fd()),
            Conn::Tcp { stream, .. } => stream.as_ref().map(|s| s.as_raw_fd()),
        }
    }
}

struct Worker<'a> {
    plan: &'a Plan,
    stats: Stats,
    scratch: Vec<u8>,
    /// The request cap was reached: issue nothing more.
    capped: bool,
    /// Completions not yet added to the shared progress counter.
    done: u64,
}

impl Worker<'_> {
    fn measuring(&self) -> bool {
        Instant::now() >= self.plan.measure_start
    }

    /// Sends the requester's next request; leaves it idle only if the cap was reached.
    fn issue(&mut self, r: &mut Requester) {
        let plan = self.plan;
        let measured = self.measuring();
        if measured {
            if let Some(cap) = plan.cap {
                if plan.issued.fetch_add(1, Ordering::Relaxed) >= cap {
                    self.capped = true;
                    return;
                }
            }
        }
        let op = if r.rng.gen::<f64>() < plan.get_ratio {
            Op::Get
        } else {
            Op::Set
        };
        let index = plan.keygen.next_index(&mut r.rng);
        r.req.clear();
        match &mut r.conn {
            Conn::Udp {
                next_id,
                reassembly,
                ..
            } => {
                let id = *next_id;
                *next_id = next_id.wrapping_add(1);
                reassembly.expect(id);
                r.req.resize(HEADER_LEN, 0);
                Header::request(id).emit(&mut r.req);
            }
            Conn::Tcp { rbuf, .. } => rbuf.clear(),
        }
        write_request(&mut r.req, op, plan, index);
        // The clock starts before the send syscall: it is part of the request's latency.
        let start = Instant::now();
        let sent = match &mut r.conn {
            Conn::Udp { sock, .. } => sock.send(&r.req).map(|_| ()),
            Conn::Tcp {
                stream: Some(s), ..
            } => s.write_all(&r.req),
            Conn::Tcp { stream: None, .. } => Err(io::ErrorKind::NotConnected.into()),
        };
        r.state = State::Waiting {
            op,
            sent: start,
            measured,
        };
        if sent.is_err() {
            self.fail(r, Instant::now());
        }
    }

    /// Reads what is available and finishes the request if its reply is complete.
    fn receive(&mut self, r: &mut Requester) {
        let State::Waiting { op, sent, measured } = r.state else {
            return;
        };
        let counting = self.measuring();
        match &mut r.conn {
            Conn::Udp {
                sock, reassembly, ..
            } => loop {
                let n = match sock.recv(&mut self.scratch) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(_) => {
                        // ICMP port unreachable and the like: the request is lost.
                        return self.fail(r, Instant::now());
                    }
                };
                match reassembly.push(&self.scratch[..n]) {
                    Push::Incomplete => {}
                    Push::Complete(payload) => {
                        let outcome = text::check(op, &payload)
                            .map(|(o, _)| o)
                            .unwrap_or(Outcome::Malformed);
                        return self.finish(r, outcome, sent, measured);
                    }
                    Push::Dropped(DropReason::Stale) if counting => self.stats.stale_datagrams += 1,
                    Push::Dropped(_) if counting => self.stats.bad_datagrams += 1,
                    Push::Dropped(_) => {}
                }
            },
            Conn::Tcp { stream, rbuf } => {
                let Some(s) = stream else { return };
                match s.read(&mut self.scratch) {
                    // The server closed the connection.
                    Ok(0) => return self.fail(r, Instant::now()),
                    Ok(n) => rbuf.extend_from_slice(&self.scratch[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::Interrupted
                        ) =>
                    {
                        return
                    }
                    Err(_) => return self.fail(r, Instant::now()),
                }
                if let Some((outcome, used)) = text::check(op, rbuf) {
                    // Bytes past the reply mean the stream is out of step with our requests.
                    let in_sync = outcome != Outcome::Malformed && used == rbuf.len();
                    rbuf.clear();
                    if !in_sync {
                        *stream = None;
                    }
                    self.finish(r, outcome, sent, measured);
                    if !in_sync {
                        r.state = State::Down(Instant::now());
                    }
                }
            }
        }
    }

    fn finish(&mut self, r: &mut Requester, outcome: Outcome, sent: Instant, measured: bool) {
        let latency = sent.elapsed();
        r.state = State::Idle;
        self.done += 1;
        if measured {
            self.stats.record(outcome, micros(latency));
        }
    }

    /// The request failed without a reply: count an error and, for TCP, reconnect.
    fn fail(&mut self, r: &mut Requester, now: Instant) {
        if let State::Waiting { measured: true, .. } = r.state {
            self.stats.errors += 1;
        }
        self.done += 1;
        r.state = match &mut r.conn {
            Conn::Udp { .. } => State::Idle,
            Conn::Tcp { stream, rbuf } => {
                *stream = None;
                rbuf.clear();
                State::Down(now)
            }
        };
    }

    fn check_timeout(&mut self, r: &mut Requester, now: Instant) {
        if let (State::Waiting { sent, measured, .. }, Conn::Udp { .. }) = (r.state, &r.conn) {
            if now.duration_since(sent) >= self.plan.timeout {
                if measured {
                    self.stats.timeouts += 1;
                }
                self.done += 1;
                // The next request gets a new id, so a late reply is recognised as stale.
                r.state = State::Idle;
            }
        }
    }

    fn reconnect(&mut self, r: &mut Requester, now: Instant) {
        if let Conn::Tcp { stream, rbuf } = &mut r.conn {
            rbuf.clear();
            match tcp_connect(self.plan.target) {
                Ok(s) => {
                    *stream = Some(s);
                    r.state = State::Idle;
                }
                Err(_) => {
                    if self.measuring() {
                        self.stats.errors += 1;
                    }
                    r.state = State::Down(now + RECONNECT_BACKOFF);
                }
            }
        }
    }
}

fn write_request(buf: &mut Vec<u8>, op: Op, plan: &Plan, index: u64) {
    match op {
        Op::Get => text::write_get(buf, &plan.key_prefix, index),
        Op::Set => text::write_set(buf, &plan.key_prefix, index, &plan.value),
    }
}
