//! Requesters and the worker threads that drive them. A requester owns one socket. In a closed
//! loop it keeps one request outstanding; in an open loop it sends on a Poisson schedule and
//! keeps as many outstanding as the schedule makes (matched by request id over UDP, in order
//! over a pipelined TCP connection). A worker multiplexes its requesters with `poll`, so an idle
//! worker sleeps instead of spinning.
//!
//! A look-aside requester (SwitchKV's look-aside clients) has a second UDP socket, to a cache
//! node: each get asks the cache node first and, on a miss, the target; its latency runs over
//! both. Sets go to the target.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use kv::rng::{Rng, Xoshiro256StarStar};

use crate::arrival::Arrivals;
use crate::encoded::{Encoder, Placement};
use crate::frame::{parse_header, DropReason, Header, Push, Reassembly, HEADER_LEN};
use crate::poll::{self, PollFd};
use crate::report::{new_series_histogram, Slice, Stats};
use crate::text::{self, Op, Outcome};
use crate::zipf::{KeyGen, Ranking};
use crate::{binary, Proto, Protocol};
use wire::keymac::Kind;

/// How long a TCP (re)connect may take; during a run never longer than the time left.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one blocking TCP write may take; during a run never longer than the time left.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause before reconnecting after a failed TCP connect.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
/// Upper bound on one `poll` so the stop conditions are checked regularly.
const MAX_WAIT: Duration = Duration::from_millis(100);
/// Large enough for any UDP datagram and a good chunk of a TCP reply.
const RECV_BUF: usize = 65_536;
/// Most requests one requester keeps outstanding in an open loop; well below the 65,536 UDP
/// request ids, so a reply can never match the wrong request. A scheduled request that finds the
/// window full is counted as an error instead of being sent.
pub const MAX_OUTSTANDING: usize = 4_096;

/// Everything the workers share; read-only apart from the counters.
pub struct Plan {
    pub target: SocketAddr,
    pub protocol: Protocol,
    pub key_prefix: String,
    pub keygen: KeyGen,
    /// The sets' own popularity, when it differs from the gets'; popularity changes move
    /// the gets' alone.
    pub write_keygen: Option<KeyGen>,
    /// Popularity changes: the permutation at epoch 0 and the length of an epoch. Each worker
    /// advances its own copy.
    pub ranking: Option<(Ranking, Duration)>,
    pub get_ratio: f64,
    pub value: Vec<u8>,
    pub timeout: Duration,
    /// Requests scheduled before this instant are warm-up and not counted.
    pub measure_start: Instant,
    pub end: Instant,
    /// Cap on measured requests.
    pub cap: Option<u64>,
    /// Open loop: each worker adjusts its requesters' rates to the loss it sees
    /// ([`kv::rate::LossControl`], SwitchKV's clients).
    pub rate_control: bool,
    /// Length of one interval of the time series.
    pub interval: Duration,
    /// Measured requests issued so far, across all workers.
    pub issued: AtomicU64,
    /// Replies and timeouts so far, warm-up included; read by the progress line.
    pub completed: AtomicU64,
    /// TCP over TLS, with these settings.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

enum Conn {
    Udp {
        sock: UdpSocket,
        next_id: u16,
        /// SwitchKV's client: requests leave as frames with their key in the destination MAC.
        encoder: Option<Encoder>,
    },
    Tcp {
        stream: Option<Stream>,
        rbuf: Vec<u8>,
    },
}

/// A TCP connection, in clear or over TLS (`--tls-ca`).
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp().set_write_timeout(t)
    }

    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp().as_raw_fd()
    }

    /// Reads what a readable socket holds into `out`: one read of the socket, and over TLS
    /// every byte that read let the session decrypt (a record that has not arrived whole
    /// waits for the next; the read never waits for it). Returns the bytes added, 0 when the
    /// server closed the connection; `WouldBlock` when TLS has no whole record yet.
    fn read_ready(&mut self, scratch: &mut [u8], out: &mut Vec<u8>) -> io::Result<usize> {
        let s = match self {
            Stream::Plain(s) => {
                let n = s.read(scratch)?;
                out.extend_from_slice(&scratch[..n]);
                return Ok(n);
            }
            Stream::Tls(s) => s,
        };
        if s.conn.read_tls(&mut s.sock)? == 0 {
            return Ok(0);
        }
        s.conn
            .process_new_packets()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        // The session may have something to say back (a key update).
        while s.conn.wants_write() {
            s.conn.write_tls(&mut s.sock)?;
        }
        let before = out.len();
        loop {
            match s.conn.reader().read(scratch) {
                // The server's close_notify: the connection is over.
                Ok(0) if out.len() == before => return Ok(0),
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&scratch[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        match out.len() - before {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            n => Ok(n),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// The TLS settings of a client that trusts the authorities (or self-signed certificate) of
/// the PEM file `ca`.
pub fn tls_client(ca: &std::path::Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let file = std::fs::File::open(ca).with_context(|| format!("{}: cannot read", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut io::BufReader::new(file)) {
        let cert = cert.with_context(|| format!("{}: not PEM", ca.display()))?;
        roots
            .add(cert)
            .with_context(|| format!("{}: not a certificate to trust", ca.display()))?;
    }
    anyhow::ensure!(!roots.is_empty(), "{}: no certificate in it", ca.display());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS: no protocol version")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A request that was sent and has not been answered or given up on.
struct Pending {
    /// UDP request id (also the binary protocol's opaque); unused over TCP.
    id: u16,
    op: Op,
    /// Latency is measured from here: the send in a closed loop, the scheduled send time in an
    /// open loop, so time spent queueing behind a slow sender counts.
    origin: Instant,
    /// When it went to the socket.
    sent: Instant,
    /// A look-aside get sent on after the cache node's miss: when it went to the cache node.
    /// Its timeout runs from there, as every other request's does from its send.
    asked_cache: Option<Instant>,
    measured: bool,
    /// The key's index, for a look-aside get that goes on to the target.
    index: u64,
    /// Answered out of order (UDP); popped once it reaches the front.
    done: bool,
    reassembly: Reassembly,
}

/// One client: a closed loop, or an open loop when it has an arrival process.
pub struct Requester {
    conn: Conn,
    rng: Xoshiro256StarStar,
    arrivals: Option<Arrivals>,
    /// Open loop: when the next request is due.
    next_send: Instant,
    pending: VecDeque<Pending>,
    /// TCP connection lost; reconnect at this instant.
    down: Option<Instant>,
    req: Vec<u8>,
    /// Look-aside: the cache node's socket and the gets waiting for its replies.
    aside: Option<Lane>,
}

/// A look-aside requester's UDP socket to its cache node.
struct Lane {
    sock: UdpSocket,
    next_id: u16,
    pending: VecDeque<Pending>,
    buf: Vec<u8>,
}

impl Pending {
    /// When its UDP timeout started.
    fn clock(&self) -> Instant {
        self.asked_cache.unwrap_or(self.sent)
    }
}

/// A request whose UDP reply is complete.
struct Finished {
    outcome: Outcome,
    origin: Instant,
    sent: Instant,
    measured: bool,
    index: u64,
}

impl Requester {
    /// Opens the requester's socket: a connected UDP socket, or a TCP connection with
    /// `TCP_NODELAY`. With `arrivals` the requester is an open loop; see
    /// [`Requester::start_schedule`].
    pub fn connect(
        proto: Proto,
        target: SocketAddr,
        tls: Option<&Arc<rustls::ClientConfig>>,
        mut rng: Xoshiro256StarStar,
        arrivals: Option<Arrivals>,
    ) -> anyhow::Result<Requester> {
        let conn = match proto {
            Proto::Udp => Conn::Udp {
                sock: nonblocking_udp(target)?,
                // A random first id makes replies meant for an earlier run's socket on the
                // same port unlikely to match.
                next_id: rng.next_u64() as u16,
                encoder: None,
            },
            Proto::Tcp => Conn::Tcp {
                stream: Some(tcp_connect(target, tls)?),
                rbuf: Vec::new(),
            },
        };
        Ok(Requester {
            conn,
            rng,
            arrivals,
            next_send: Instant::now(),
            pending: VecDeque::new(),
            down: None,
            req: Vec::with_capacity(256),
            aside: None,
        })
    }

    /// Makes the requester look-aside: its gets ask the cache node at `cache` first.
    pub fn look_aside(mut self, cache: SocketAddr) -> anyhow::Result<Requester> {
        self.aside = Some(Lane {
            sock: nonblocking_udp(cache)?,
            next_id: self.rng.next_u64() as u16,
            pending: VecDeque::new(),
            buf: Vec::with_capacity(256),
        });
        Ok(self)
    }

    /// Makes the requester one of SwitchKV's clients: its requests leave as frames encoded
    /// for `placement`, from the address its socket to `target` has, and its socket takes
    /// replies from any sender (the backend or cache node answers).
    pub fn encoded(
        mut self,
        target: SocketAddr,
        placement: Arc<Placement>,
    ) -> anyhow::Result<Requester> {
        let Conn::Udp { sock, encoder, .. } = &mut self.conn else {
            anyhow::bail!("--switchkv encodes keys in UDP queries: use --proto udp");
        };
        let SocketAddr::V4(route) = sock.local_addr().context("local address")? else {
            anyhow::bail!("--switchkv needs an IPv4 target, got {target}");
        };
        // The connected socket's address is the one the route to the target leaves from.
        let open = UdpSocket::bind((*route.ip(), 0)).context("failed to bind UDP socket")?;
        open.set_nonblocking(true)
            .context("failed to make UDP socket non-blocking")?;
        let SocketAddr::V4(source) = open.local_addr().context("local address")? else {
            anyhow::bail!("--switchkv needs an IPv4 target, got {target}");
        };
        *encoder = Some(Encoder::open(source, placement)?);
        *sock = open;
        Ok(self)
    }

    /// Open loop: the first request is due one random gap after `start`.
    pub fn start_schedule(&mut self, start: Instant) {
        self.next_send = start;
        self.advance_schedule();
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.conn {
            Conn::Udp { sock, .. } => Some(sock.as_raw_fd()),
            Conn::Tcp { stream, .. } => stream.as_ref().map(|s| s.as_raw_fd()),
        }
    }

    fn advance_schedule(&mut self) {
        if let Some(a) = &mut self.arrivals {
            self.next_send += a.next_gap();
        }
    }
}

fn nonblocking_udp(target: SocketAddr) -> anyhow::Result<UdpSocket> {
    let sock = udp_socket(target)?;
    sock.set_nonblocking(true)
        .context("failed to make UDP socket non-blocking")?;
    Ok(sock)
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
pub fn tcp_connect(
    target: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> anyhow::Result<Stream> {
    tcp_connect_within(target, CONNECT_TIMEOUT, tls)
}

/// [`tcp_connect`] giving up after `timeout` (at most [`CONNECT_TIMEOUT`]); the write timeout
/// is no longer than `timeout` either.
fn tcp_connect_within(
    target: SocketAddr,
    timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> anyhow::Result<Stream> {
    let deadline = Instant::now() + timeout.min(CONNECT_TIMEOUT);
    let timeout = timeout.min(CONNECT_TIMEOUT);
    if timeout.is_zero() {
        anyhow::bail!("no time left to connect to {target} over TCP");
    }
    let s = TcpStream::connect_timeout(&target, timeout)
        .with_context(|| format!("failed to connect to {target} over TCP"))?;
    s.set_nodelay(true).context("failed to set TCP_NODELAY")?;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .context("failed to set read timeout")?;
    s.set_write_timeout(Some(timeout.min(WRITE_TIMEOUT)))
        .context("failed to set write timeout")?;
    let Some(tls) = tls else {
        return Ok(Stream::Plain(s));
    };
    let name = rustls::pki_types::ServerName::IpAddress(target.ip().into());
    let mut conn = rustls::ClientConnection::new(tls.clone(), name)
        .with_context(|| format!("TLS to {target}"))?;
    let mut sock = s;
    while conn.is_handshaking() {
        match conn.complete_io(&mut sock) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) && Instant::now() < deadline => {}
            Err(e) => return Err(e).with_context(|| format!("TLS handshake with {target}")),
        }
    }
    Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(conn, sock))))
}

/// Writes all of `buf`, giving up with `TimedOut` at `deadline`: each blocking write is bounded
/// by the time left, so the whole call never outlasts `deadline` by more than a syscall.
fn write_all_by(s: &mut Stream, mut buf: &[u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        if left < WRITE_TIMEOUT {
            // The time left only shrinks, so once lowered the socket's timeout stays lower.
            s.set_write_timeout(Some(left))?;
        }
        match s.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // TLS holds what it has not sent yet until flushed.
    s.flush()
}

/// Rounds up to whole microseconds, so any real reply records at least 1 µs.
fn micros(d: Duration) -> u64 {
    d.as_nanos().div_ceil(1000).min(u128::from(u64::MAX)) as u64
}

/// Runs `requesters` until the plan's end, or until the request cap is reached and every
/// outstanding request finished. Returns the measured counters and when the worker stopped;
/// the time series goes to `series` one interval at a time, tagged with `id`.
pub fn run(
    plan: &Plan,
    mut requesters: Vec<Requester>,
    id: usize,
    series: Sender<Slice>,
) -> (Stats, Instant) {
    let mut w = Worker::new(plan, id, series);
    let mut fds: Vec<PollFd> = Vec::with_capacity(requesters.len());
    // Each polled socket's requester, and whether it is the look-aside one.
    let mut owners: Vec<(usize, bool)> = Vec::with_capacity(requesters.len());
    loop {
        let now = Instant::now();
        if now >= plan.end {
            w.flush_slice(true);
            return (w.stats, plan.end);
        }
        w.roll_slice(now);
        let mut next = plan.end.min(now + MAX_WAIT);
        fds.clear();
        owners.clear();
        let mut outstanding = false;
        for (i, r) in requesters.iter_mut().enumerate() {
            // Reconnects and writes block for a while; the run still ends on time.
            if Instant::now() >= plan.end {
                break;
            }
            if let Some(at) = r.down {
                if now >= at {
                    w.reconnect(r, now);
                }
            }
            w.send_due(r, now);
            if r.arrivals.is_some() && !w.capped {
                next = next.min(r.next_send);
            }
            if let Some(c) = &w.control {
                // Short of its requests a period waits for a send (which wakes the loop
                // anyway) or its longest wait, not spinning on a time already past.
                let due = if c.sent >= CONTROL_SENT {
                    c.next
                } else {
                    c.next + CONTROL_WAIT
                };
                next = next.min(due);
            }
            if let Some(at) = r.down {
                next = next.min(at);
            }
            if let Some(front) = r.pending.front() {
                outstanding = true;
                if matches!(r.conn, Conn::Udp { .. }) {
                    // A look-aside requester's queue is not in timeout order.
                    let first = match r.aside {
                        Some(_) => r.pending.iter().map(Pending::clock).min(),
                        None => Some(front.clock()),
                    };
                    next = next.min(first.unwrap_or(front.clock()) + plan.timeout);
                }
                if let Some(fd) = r.raw_fd() {
                    fds.push(PollFd::readable(fd));
                    owners.push((i, false));
                }
            }
            if let Some(front) = r.aside.as_ref().and_then(|a| a.pending.front()) {
                outstanding = true;
                next = next.min(front.clock() + plan.timeout);
                if let Some(a) = &r.aside {
                    fds.push(PollFd::readable(a.sock.as_raw_fd()));
                    owners.push((i, true));
                }
            }
        }
        if w.capped && !outstanding {
            w.flush_slice(true);
            return (w.stats, Instant::now());
        }
        let wait = next.saturating_duration_since(Instant::now());
        if fds.is_empty() {
            std::thread::sleep(wait);
        } else if poll::wait(&mut fds, wait).is_err() {
            // poll only fails on resource exhaustion; back off rather than spin.
            std::thread::sleep(Duration::from_millis(1));
        }
        for (fd, &(i, aside)) in fds.iter().zip(&owners) {
            if fd.ready() {
                match aside {
                    true => w.receive_aside(&mut requesters[i]),
                    false => w.receive(&mut requesters[i]),
                }
            }
        }
        let now = Instant::now();
        for r in requesters.iter_mut() {
            w.check_timeouts(r, now);
        }
        w.control(&mut requesters, now);
        if w.done > 0 {
            plan.completed.fetch_add(w.done, Ordering::Relaxed);
            w.done = 0;
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
    ranking: Option<(Ranking, Duration)>,
    /// This worker's number in the time series.
    id: usize,
    series: Sender<Slice>,
    /// The interval being collected, and what it holds so far.
    slice_interval: u64,
    slice_requests: u64,
    slice_latency: Histogram<u64>,
    /// Replies completed by the last read, reused.
    finished: Vec<Finished>,
    /// With rate control: the factor on the requesters' rates, the next adjustment, and the
    /// requests sent and replies read since the last.
    control: Option<Control>,
}

/// A worker's rate control: SwitchKV's clients count what they sent and what came back each
/// period, so a loss shows within the period rather than a timeout later.
struct Control {
    factor: kv::rate::LossControl,
    next: Instant,
    sent: u64,
    replied: u64,
}

/// How often rate control adjusts (SwitchKV's clients: every 10 ms), at the soonest.
const CONTROL_EVERY: Duration = Duration::from_millis(10);
/// Requests a period of rate control holds, unless [`CONTROL_WAIT`] more has passed.
const CONTROL_SENT: u64 = 100;
const CONTROL_WAIT: Duration = Duration::from_secs(1);

/// What ended a measured request, for the counters.
enum End {
    Reply(Outcome, u64),
    Error,
    Timeout,
}

impl<'a> Worker<'a> {
    fn new(plan: &'a Plan, id: usize, series: Sender<Slice>) -> Worker<'a> {
        Worker {
            plan,
            stats: Stats::default(),
            scratch: vec![0u8; RECV_BUF],
            capped: false,
            done: 0,
            ranking: plan.ranking.clone(),
            id,
            series,
            slice_interval: 0,
            slice_requests: 0,
            slice_latency: new_series_histogram(),
            finished: Vec::new(),
            control: plan.rate_control.then(|| Control {
                factor: kv::rate::LossControl::switchkv(1.0, 0.01, 100.0),
                next: Instant::now() + CONTROL_EVERY,
                sent: 0,
                replied: 0,
            }),
        }
    }

    /// Every [`CONTROL_EVERY`], scales the requesters' rates by the loss seen since the last
    /// time: the requests sent that no reply answered in the period.
    fn control(&mut self, requesters: &mut [Requester], now: Instant) {
        let Some(c) = &mut self.control else {
            return;
        };
        // A period holds at least CONTROL_SENT requests, so that its loss can be read to a
        // percent (SwitchKV's clients sent millions a second: theirs always did).
        if now < c.next || (c.sent < CONTROL_SENT && now < c.next + CONTROL_WAIT) {
            return;
        }
        let factor = c.factor.adjust(c.sent, c.sent.saturating_sub(c.replied));
        c.sent = 0;
        c.replied = 0;
        c.next = now + CONTROL_EVERY;
        for r in requesters.iter_mut() {
            if let Some(a) = &mut r.arrivals {
                a.set_scale(factor);
            }
        }
    }

    fn measuring(&self) -> bool {
        Instant::now() >= self.plan.measure_start
    }

    fn interval_of(&self, t: Instant) -> u64 {
        // A reply read just after the window closed still belongs to its last interval.
        let last = self.plan.end - Duration::from_nanos(1);
        let since = t
            .min(last)
            .saturating_duration_since(self.plan.measure_start);
        (since.as_nanos() / self.plan.interval.as_nanos().max(1)) as u64
    }

    /// Hands the collected interval to the series if `now` is past it.
    fn roll_slice(&mut self, now: Instant) {
        let i = self.interval_of(now);
        if i > self.slice_interval {
            self.flush_slice(false);
            self.slice_interval = i;
        }
    }

    fn flush_slice(&mut self, last: bool) {
        let latency = std::mem::replace(&mut self.slice_latency, new_series_histogram());
        // The receiver only goes away once the run is over.
        let _ = self.series.send(Slice {
            worker: self.id,
            interval: self.slice_interval,
            requests: std::mem::take(&mut self.slice_requests),
            latency,
            last,
        });
    }

    /// Counts the end of a request; only measured requests reach the counters.
    fn count(&mut self, measured: bool, end: End) {
        self.done += 1;
        if let Some(c) = &mut self.control {
            c.replied += u64::from(matches!(end, End::Reply(..)));
        }
        if !measured {
            return;
        }
        let now = Instant::now();
        self.roll_slice(now);
        self.slice_requests += 1;
        match end {
            End::Reply(outcome, us) => {
                self.stats.record(outcome, us);
                self.slice_latency.saturating_record(us.max(1));
            }
            End::Error => self.stats.errors += 1,
            End::Timeout => self.stats.timeouts += 1,
        }
    }

    /// Sends what is due: in a closed loop the next request once the last one finished, in an
    /// open loop every request whose scheduled time has come.
    fn send_due(&mut self, r: &mut Requester, now: Instant) {
        if r.arrivals.is_none() {
            let idle =
                r.pending.is_empty() && r.aside.as_ref().is_none_or(|a| a.pending.is_empty());
            if idle && r.down.is_none() && !self.capped {
                let origin = Instant::now();
                self.issue(r, origin);
            }
        } else {
            while !self.capped && r.next_send <= now {
                let origin = r.next_send;
                r.advance_schedule();
                if r.down.is_some() {
                    // The connection is down: the scheduled request fails rather than
                    // vanishing, so the offered load is accounted for.
                    if self.admit(origin) {
                        self.count(origin >= self.plan.measure_start, End::Error);
                    }
                    continue;
                }
                self.issue(r, origin);
            }
        }
        self.flush_tcp(r);
    }

    /// Applies the request cap to a request scheduled at `origin`; false once it is reached.
    fn admit(&mut self, origin: Instant) -> bool {
        let plan = self.plan;
        if origin < plan.measure_start {
            if let Some(c) = &mut self.control {
                c.sent += 1;
            }
            return true;
        }
        if let Some(cap) = plan.cap {
            if plan.issued.fetch_add(1, Ordering::Relaxed) >= cap {
                self.capped = true;
                return false;
            }
        }
        self.stats.sent += 1;
        if let Some(c) = &mut self.control {
            c.sent += 1;
        }
        true
    }

    /// Builds one request due at `origin`; UDP sends it at once, TCP queues it in `r.req` for
    /// [`Worker::flush_tcp`].
    fn issue(&mut self, r: &mut Requester, origin: Instant) {
        let plan = self.plan;
        if !self.admit(origin) {
            return;
        }
        let measured = origin >= plan.measure_start;
        let op = if r.rng.f64() < plan.get_ratio {
            Op::Get
        } else {
            Op::Set
        };
        let index = match (&mut self.ranking, op, &plan.write_keygen) {
            (_, Op::Set, Some(writes)) => writes.next_index(&mut r.rng),
            (Some((ranking, every)), _, _) => {
                let since = origin.saturating_duration_since(plan.measure_start);
                ranking.advance_to((since.as_nanos() / every.as_nanos().max(1)) as u64);
                plan.keygen.next_index_ranked(&mut r.rng, Some(ranking))
            }
            (None, _, _) => plan.keygen.next_index(&mut r.rng),
        };
        let p = Pending {
            id: 0,
            op,
            origin,
            sent: origin,
            asked_cache: None,
            measured,
            index,
            done: false,
            reassembly: Reassembly::default(),
        };
        match (&mut r.aside, op) {
            (Some(lane), Op::Get) => {
                if lane.pending.len() >= MAX_OUTSTANDING {
                    return self.count(measured, End::Error);
                }
                if !send_udp(
                    &lane.sock,
                    None,
                    &mut lane.next_id,
                    &mut lane.buf,
                    plan,
                    p,
                    &mut lane.pending,
                ) {
                    self.count(measured, End::Error);
                }
            }
            _ => self.send(r, p),
        }
    }

    /// Sends `p` to the target: at once over UDP, queued in `r.req` over TCP.
    fn send(&mut self, r: &mut Requester, mut p: Pending) {
        let plan = self.plan;
        if r.pending.len() >= MAX_OUTSTANDING {
            return self.count(p.measured, End::Error);
        }
        match &mut r.conn {
            Conn::Udp {
                sock,
                next_id,
                encoder,
            } => {
                let measured = p.measured;
                let sent = send_udp(
                    sock,
                    encoder.as_mut(),
                    next_id,
                    &mut r.req,
                    plan,
                    p,
                    &mut r.pending,
                );
                if !sent {
                    self.count(measured, End::Error);
                }
            }
            Conn::Tcp { .. } => {
                write_request(&mut r.req, p.op, plan, p.index, 0);
                p.sent = Instant::now();
                r.pending.push_back(p);
            }
        }
    }

    /// Writes the TCP requests queued by [`Worker::issue`] in one go.
    fn flush_tcp(&mut self, r: &mut Requester) {
        if r.req.is_empty() {
            return;
        }
        let result = match &mut r.conn {
            Conn::Tcp {
                stream: Some(s), ..
            } => write_all_by(s, &r.req, self.plan.end),
            _ => Err(io::ErrorKind::NotConnected.into()),
        };
        r.req.clear();
        if result.is_err() {
            let now = Instant::now();
            if now >= self.plan.end {
                // The run ended while the write waited: its requests are left unanswered,
                // like every request still outstanding at the end, not failed.
                return;
            }
            self.fail_tcp(r, now);
        }
    }

    /// Reads what is available and finishes every request whose reply is complete.
    fn receive(&mut self, r: &mut Requester) {
        if matches!(r.conn, Conn::Udp { .. }) {
            self.receive_udp(r);
        } else {
            self.receive_tcp(r);
        }
    }

    fn receive_udp(&mut self, r: &mut Requester) {
        let Conn::Udp { sock, .. } = &r.conn else {
            return;
        };
        let mut finished = std::mem::take(&mut self.finished);
        self.read_udp(sock, &mut r.pending, &mut finished);
        for f in finished.drain(..) {
            self.count(
                f.measured,
                End::Reply(f.outcome, micros(f.origin.elapsed())),
            );
        }
        self.finished = finished;
    }

    /// The cache node's replies: a hit (or any answer but a miss) ends the get; a miss sends it
    /// on to the target, its clock still running.
    fn receive_aside(&mut self, r: &mut Requester) {
        let Some(lane) = &mut r.aside else {
            return;
        };
        let mut finished = std::mem::take(&mut self.finished);
        self.read_udp(&lane.sock, &mut lane.pending, &mut finished);
        for f in finished.drain(..) {
            if f.outcome != Outcome::Miss {
                self.count(
                    f.measured,
                    End::Reply(f.outcome, micros(f.origin.elapsed())),
                );
                continue;
            }
            let p = Pending {
                id: 0,
                op: Op::Get,
                origin: f.origin,
                sent: f.origin,
                asked_cache: Some(f.sent),
                measured: f.measured,
                index: f.index,
                done: false,
                reassembly: Reassembly::default(),
            };
            self.send(r, p);
        }
        self.finished = finished;
    }

    /// Reads what `sock` has; each request of `pending` whose reply is now complete goes to
    /// `finished`.
    fn read_udp(
        &mut self,
        sock: &UdpSocket,
        pending: &mut VecDeque<Pending>,
        finished: &mut Vec<Finished>,
    ) {
        let protocol = self.plan.protocol;
        let counting = self.measuring();
        loop {
            let n = match sock.recv(&mut self.scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // ICMP port unreachable and the like: the oldest request is lost.
                    if let Some(p) = pending.pop_front() {
                        self.count(p.measured, End::Error);
                    }
                    pop_done(pending);
                    return;
                }
            };
            let datagram = &self.scratch[..n];
            // Pending ids are consecutive from the front's, so the id gives the slot; the id
            // is still compared, so a reply can only ever finish its own request.
            let (slot, id) = match (parse_header(datagram), pending.front()) {
                (Ok(h), Some(front)) => (
                    usize::from(h.request_id.wrapping_sub(front.id)),
                    h.request_id,
                ),
                (Ok(_), None) => (usize::MAX, 0),
                (Err(_), _) => {
                    if counting {
                        self.stats.bad_datagrams += 1;
                    }
                    continue;
                }
            };
            let Some(p) = pending.get_mut(slot).filter(|p| !p.done && p.id == id) else {
                if counting {
                    self.stats.stale_datagrams += 1;
                }
                continue;
            };
            match p.reassembly.push(datagram) {
                Push::Incomplete => {}
                Push::Complete(payload) => {
                    p.done = true;
                    finished.push(Finished {
                        outcome: check_datagram_reply(protocol, p.op, &payload),
                        origin: p.origin,
                        sent: p.sent,
                        measured: p.measured,
                        index: p.index,
                    });
                    pop_done(pending);
                }
                Push::Dropped(DropReason::Stale) if counting => self.stats.stale_datagrams += 1,
                Push::Dropped(_) if counting => self.stats.bad_datagrams += 1,
                Push::Dropped(_) => {}
            }
        }
    }

    fn receive_tcp(&mut self, r: &mut Requester) {
        let protocol = self.plan.protocol;
        let Conn::Tcp {
            stream: Some(s),
            rbuf,
        } = &mut r.conn
        else {
            return;
        };
        match s.read_ready(&mut self.scratch, rbuf) {
            // The server closed the connection.
            Ok(0) => return self.fail_tcp(r, Instant::now()),
            Ok(_) => {}
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
            Err(_) => return self.fail_tcp(r, Instant::now()),
        }
        // Replies come back in request order; parse as many as are complete.
        let mut used = 0;
        let mut in_sync = true;
        while let Some(p) = r.pending.front() {
            let Some((outcome, n)) = check_reply(protocol, p.op, &rbuf[used..]) else {
                break;
            };
            used += n;
            let (origin, measured) = (p.origin, p.measured);
            r.pending.pop_front();
            self.count(measured, End::Reply(outcome, micros(origin.elapsed())));
            if outcome == Outcome::Malformed {
                in_sync = false;
                break;
            }
        }
        rbuf.drain(..used);
        // Bytes nobody asked for mean the stream is out of step with our requests.
        if !in_sync || (r.pending.is_empty() && !rbuf.is_empty()) {
            self.fail_tcp(r, Instant::now());
        }
    }

    /// The connection failed: every outstanding request is an error; reconnect right away.
    fn fail_tcp(&mut self, r: &mut Requester, now: Instant) {
        while let Some(p) = r.pending.pop_front() {
            self.count(p.measured, End::Error);
        }
        if let Conn::Tcp { stream, rbuf } = &mut r.conn {
            *stream = None;
            rbuf.clear();
        }
        r.req.clear();
        r.down = Some(now);
    }

    fn check_timeouts(&mut self, r: &mut Requester, now: Instant) {
        if let Some(lane) = &mut r.aside {
            self.time_out(&mut lane.pending, now);
            // Gets sent on after a miss keep their first clock, so the target's queue is not
            // in timeout order: every request in it is looked at.
            for p in r.pending.iter_mut() {
                if !p.done && now.duration_since(p.clock()) >= self.plan.timeout {
                    p.done = true;
                    let measured = p.measured;
                    self.count(measured, End::Timeout);
                }
            }
            pop_done(&mut r.pending);
        } else if matches!(r.conn, Conn::Udp { .. }) {
            self.time_out(&mut r.pending, now);
        }
    }

    /// Gives up on the UDP requests of `pending` that have waited the timeout.
    fn time_out(&mut self, pending: &mut VecDeque<Pending>, now: Instant) {
        // Requests leave in send order with one timeout, so only the front can be overdue.
        while let Some(p) = pending.front() {
            if !p.done && now.duration_since(p.clock()) < self.plan.timeout {
                break;
            }
            let (done, measured) = (p.done, p.measured);
            pending.pop_front();
            if !done {
                // A late reply carries an id no longer pending, so it counts as stale.
                self.count(measured, End::Timeout);
            }
        }
    }

    fn reconnect(&mut self, r: &mut Requester, now: Instant) {
        if let Conn::Tcp { stream, rbuf } = &mut r.conn {
            rbuf.clear();
            let left = self.plan.end.saturating_duration_since(Instant::now());
            match tcp_connect_within(self.plan.target, left, self.plan.tls.as_ref()) {
                Ok(s) => {
                    *stream = Some(s);
                    r.down = None;
                }
                Err(_) => {
                    let measured = self.measuring();
                    self.count(measured, End::Error);
                    r.down = Some(now + RECONNECT_BACKOFF);
                }
            }
        }
    }
}

/// Drops requests answered out of order once everything before them is gone too.
fn pop_done(pending: &mut VecDeque<Pending>) {
    while pending.front().is_some_and(|p| p.done) {
        pending.pop_front();
    }
}

/// Sends `p` over UDP under the socket's next id and queues it on `pending`; false if the send
/// failed (the id is then not used up: pending ids stay consecutive, which is how replies find
/// their request).
fn send_udp(
    sock: &UdpSocket,
    encoder: Option<&mut Encoder>,
    next_id: &mut u16,
    buf: &mut Vec<u8>,
    plan: &Plan,
    mut p: Pending,
    pending: &mut VecDeque<Pending>,
) -> bool {
    p.id = *next_id;
    p.reassembly.expect(p.id);
    buf.clear();
    buf.resize(HEADER_LEN, 0);
    Header::single(p.id).emit(buf);
    write_request(buf, p.op, plan, p.index, p.id);
    // The clock starts before the send syscall: it is part of the latency.
    p.sent = Instant::now();
    let ok = match encoder {
        Some(e) => {
            let kind = match p.op {
                Op::Get => Kind::Get,
                Op::Set => Kind::Other,
            };
            e.send(kind, &plan.key_prefix, p.index, buf).is_ok()
        }
        None => sock.send(buf).is_ok(),
    };
    buf.clear();
    if ok {
        *next_id = next_id.wrapping_add(1);
        pending.push_back(p);
    }
    ok
}

/// Appends one request in the plan's protocol; `opaque` is echoed by binary replies.
fn write_request(buf: &mut Vec<u8>, op: Op, plan: &Plan, index: u64, opaque: u16) {
    let prefix = &plan.key_prefix;
    match (plan.protocol, op) {
        (Protocol::Text, Op::Get) => text::write_get(buf, prefix, index),
        (Protocol::Text, Op::Set) => text::write_set(buf, prefix, index, &plan.value),
        (Protocol::Binary, Op::Get) => binary::write_get(buf, prefix, index, opaque.into()),
        (Protocol::Binary, Op::Set) => {
            binary::write_set(buf, prefix, index, &plan.value, opaque.into())
        }
    }
}

/// What the reassembled payload of a UDP reply to `op` was. The payload must be exactly one
/// complete reply: a truncated one, or one followed by stray bytes, is `Malformed`.
pub fn check_datagram_reply(protocol: Protocol, op: Op, payload: &[u8]) -> Outcome {
    match check_reply(protocol, op, payload) {
        Some((outcome, used)) if used == payload.len() => outcome,
        _ => Outcome::Malformed,
    }
}

/// Whether `buf` starts with a complete reply to `op`, and what it was.
pub fn check_reply(protocol: Protocol, op: Op, buf: &[u8]) -> Option<(Outcome, usize)> {
    match protocol {
        Protocol::Text => text::check(op, buf),
        Protocol::Binary => binary::check(op, buf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(target: SocketAddr, get_ratio: f64, value_size: usize) -> Plan {
        let now = Instant::now();
        Plan {
            tls: None,
            target,
            protocol: Protocol::Text,
            key_prefix: "k".into(),
            keygen: KeyGen::new(10, 0.0, false),
            write_keygen: None,
            ranking: None,
            get_ratio,
            value: text::value(value_size),
            timeout: Duration::from_secs(10),
            measure_start: now,
            end: now + Duration::from_secs(60),
            cap: None,
            rate_control: false,
            interval: Duration::from_secs(1),
            issued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }
    }

    #[test]
    fn failed_udp_send_does_not_shift_reply_matching() {
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let target = server.local_addr().expect("addr");
        // Gets fit in a datagram; sets of a value this large cannot be sent at all.
        let gets = plan(target, 1.0, 0);
        let sets = plan(target, 0.0, 70_000);
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut g = Worker::new(&gets, 0, tx.clone());
        let mut s = Worker::new(&sets, 0, tx);
        let mut r = Requester::connect(
            Proto::Udp,
            target,
            None,
            Xoshiro256StarStar::seed_from_u64(1),
            None,
        )
        .expect("udp");
        let now = Instant::now();
        g.issue(&mut r, now);
        s.issue(&mut r, now);
        g.issue(&mut r, now);
        s.issue(&mut r, now);
        g.issue(&mut r, now);
        assert_eq!(s.stats.errors, 2, "the oversized sends fail");
        assert_eq!(r.pending.len(), 3);

        // Answer every request that arrived with a miss under its own id, newest first, so
        // each reply has to find its request behind the front of the queue.
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut buf = [0u8; 2048];
        let mut requests = Vec::new();
        for _ in 0..3 {
            let (n, from) = server.recv_from(&mut buf).expect("request");
            let h = parse_header(&buf[..n]).expect("header");
            requests.push((h.request_id, from));
        }
        for &(id, from) in requests.iter().rev() {
            let mut reply = vec![0u8; HEADER_LEN];
            Header::single(id).emit(&mut reply);
            reply.extend_from_slice(b"END\r\n");
            server.send_to(&reply, from).expect("reply");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while g.stats.misses < 3 && Instant::now() < deadline {
            g.receive(&mut r);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(g.stats.misses, 3);
        assert_eq!(g.stats.stale_datagrams, 0);
        assert_eq!(g.stats.errors, 0);
        assert!(r.pending.is_empty());
    }

    /// With a popularity of their own, sets spread over the keys while gets keep to the
    /// gets' (key 0 of 1,000 but once in about a billion draws: Zipf 30 in key order).
    #[test]
    fn sets_follow_their_own_popularity() {
        use std::collections::HashSet;
        let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let mut mixed = plan(server.local_addr().unwrap(), 0.5, 1);
        mixed.keygen = KeyGen::new(1000, 30.0, false);
        mixed.write_keygen = Some(KeyGen::new(1000, 0.0, false));
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut w = Worker::new(&mixed, 0, tx);
        let mut r = Requester::connect(
            Proto::Udp,
            server.local_addr().unwrap(),
            None,
            Xoshiro256StarStar::seed_from_u64(7),
            None,
        )
        .expect("udp");
        let (mut get_keys, mut set_keys) = (HashSet::new(), HashSet::new());
        for _ in 0..200 {
            w.issue(&mut r, Instant::now());
            let (_, body, _) = take(&server);
            let line = String::from_utf8_lossy(&body).into_owned();
            let key = line
                .split_whitespace()
                .nth(1)
                .unwrap_or_default()
                .to_string();
            match line.starts_with("set ") {
                true => set_keys.insert(key),
                false => get_keys.insert(key),
            };
        }
        assert_eq!(get_keys.len(), 1, "{get_keys:?}");
        assert!(set_keys.len() > 50, "{} keys set", set_keys.len());
    }

    /// Receives one request datagram: its id, its bytes after the header, and its sender.
    fn take(server: &UdpSocket) -> (u16, Vec<u8>, SocketAddr) {
        let mut buf = [0u8; 2048];
        let (n, from) = server.recv_from(&mut buf).expect("request");
        let h = parse_header(&buf[..n]).expect("header");
        (h.request_id, buf[HEADER_LEN..n].to_vec(), from)
    }

    fn answer(server: &UdpSocket, id: u16, to: SocketAddr, body: &[u8]) {
        let mut reply = vec![0u8; HEADER_LEN];
        Header::single(id).emit(&mut reply);
        reply.extend_from_slice(body);
        server.send_to(&reply, to).expect("reply");
    }

    #[test]
    fn a_look_aside_get_asks_the_cache_node_first_and_the_target_on_a_miss() {
        let cache = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let target = UdpSocket::bind("127.0.0.1:0").expect("bind");
        for s in [&cache, &target] {
            s.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
        }
        let gets = plan(target.local_addr().unwrap(), 1.0, 0);
        let sets = plan(target.local_addr().unwrap(), 0.0, 1);
        let (tx, _rx) = std::sync::mpsc::channel();
        let mut w = Worker::new(&gets, 0, tx.clone());
        let mut ws = Worker::new(&sets, 0, tx);
        let mut r = Requester::connect(
            Proto::Udp,
            target.local_addr().unwrap(),
            None,
            Xoshiro256StarStar::seed_from_u64(1),
            None,
        )
        .expect("udp")
        .look_aside(cache.local_addr().unwrap())
        .expect("look-aside");
        let now = Instant::now();
        // A set goes straight to the target.
        ws.issue(&mut r, now);
        let (set_id, set, set_from) = take(&target);
        assert!(set.starts_with(b"set "), "{set:?}");
        answer(&target, set_id, set_from, b"STORED\r\n");
        let deadline = Instant::now() + Duration::from_secs(2);
        while ws.stats.sets < 1 && Instant::now() < deadline {
            ws.receive(&mut r);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ws.stats.sets, 1);
        w.issue(&mut r, now);
        w.issue(&mut r, now);
        // The cache node has the first key, not the second.
        let (hit_id, hit, from) = take(&cache);
        let (miss_id, miss, _) = take(&cache);
        assert!(hit.starts_with(b"get ") && miss.starts_with(b"get "));
        let key = |get: &[u8]| get[4..get.len() - 2].to_vec();
        let mut value = b"VALUE ".to_vec();
        value.extend_from_slice(&key(&hit));
        value.extend_from_slice(b" 0 1\r\nx\r\nEND\r\n");
        answer(&cache, hit_id, from, &value);
        answer(&cache, miss_id, from, b"END\r\n");
        let deadline = Instant::now() + Duration::from_secs(2);
        while w.stats.hits < 1 && Instant::now() < deadline {
            w.receive_aside(&mut r);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!((w.stats.hits, w.stats.misses), (1, 0));
        // The miss went on to the target, the same key, and ends there.
        let (id, again, from) = take(&target);
        assert_eq!(again, miss);
        answer(&target, id, from, b"END\r\n");
        let deadline = Instant::now() + Duration::from_secs(2);
        while w.stats.misses < 1 && Instant::now() < deadline {
            w.receive(&mut r);
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!((w.stats.hits, w.stats.misses, w.stats.gets), (1, 1, 2));
        assert!(r.pending.is_empty() && r.aside.as_ref().unwrap().pending.is_empty());
    }

    #[test]
    fn datagram_reply_must_fill_the_payload() {
        let mut hit = vec![binary::MAGIC_RESPONSE, binary::OP_GET, 0, 0, 0, 0, 0, 0];
        hit.extend_from_slice(&2u32.to_be_bytes());
        hit.extend_from_slice(&[0; 12]);
        hit.extend_from_slice(b"ok");
        assert_eq!(
            check_datagram_reply(Protocol::Binary, Op::Get, &hit),
            Outcome::Hit
        );
        let mut trailing = hit.clone();
        trailing.extend_from_slice(b"junk");
        assert_eq!(
            check_datagram_reply(Protocol::Binary, Op::Get, &trailing),
            Outcome::Malformed
        );
        assert_eq!(
            check_datagram_reply(Protocol::Binary, Op::Get, &hit[..hit.len() - 1]),
            Outcome::Malformed
        );
        assert_eq!(
            check_datagram_reply(Protocol::Text, Op::Get, b"END\r\n"),
            Outcome::Miss
        );
        assert_eq!(
            check_datagram_reply(Protocol::Text, Op::Get, b"END\r\nEND\r\n"),
            Outcome::Malformed
        );
    }
}
