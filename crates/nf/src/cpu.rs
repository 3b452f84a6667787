//! An agent's way to a switch's CPU path: the frames entries send to the CPU, frames sent out
//! of ports, and registers read and written. Over the CPU channel (a local socket the switch
//! serves on its forwarding thread; `switch.cpu_socket`) when the agent runs beside the
//! switch, else over the control API's HTTP routes. Tables and entries always go through the
//! API.
//!
//! [`Cpu::open`] finds the channel in the switch's status (`cpu_channel.path`). With
//! [`CpuMode::Auto`] an agent that cannot reach it (another machine, a switch with the channel
//! off) falls back to HTTP and says so; [`CpuMode::Channel`] makes that an error. A switch
//! that refuses the agent (a wrong token, another agent taking the frames) is an error
//! either way. The agent checks that the socket's other end runs as its own user or root.
//!
//! Over the channel a send is not answered unless the switch refuses it (a port that does
//! not exist); the refusal arrives behind the send, and each call first takes in what has
//! arrived, so it is returned by the first call made once it is there.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use api::Client;
use kvio::seqpacket::{SeqConn, MAX_MESSAGE};
use switch::channel::{FromSwitch, ToSwitch};
use switch::control::CpuPacket;

/// How an agent reaches the CPU path.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuMode {
    /// The CPU channel when the switch offers one this agent can open, else HTTP.
    #[default]
    Auto,
    /// The CPU channel, or fail.
    Channel,
    /// The control API's HTTP routes.
    Http,
}

/// The `--cpu` option of every agent.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct CpuArgs {
    /// How the agent takes frames from and sends frames to the switch's CPU path, and reads
    /// registers: `auto` (the switch's local CPU channel, HTTP if it has none this agent can
    /// open), `channel` or `http`.
    #[arg(long = "cpu", value_enum, default_value_t = CpuMode::Auto, global = true)]
    pub mode: CpuMode,
}

/// An agent's connection to one switch's CPU path.
pub struct Cpu {
    way: Way,
}

enum Way {
    Http(Client),
    Channel(Channel),
}

struct Channel {
    conn: SeqConn,
    /// Frames that came while an answer was awaited.
    frames: VecDeque<CpuPacket>,
    /// A send the switch refused, told at the next call.
    refused: Option<String>,
    next_id: u32,
    /// Messages taken from the switch.
    received: u64,
    buf: Vec<u8>,
    out: Vec<u8>,
}

/// The switch refused the agent's hello.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the switch refused: {}", self.0)
    }
}

impl std::error::Error for Refused {}

/// How long a send may wait for room before the agent gives up on the switch.
const SEND_LIMIT: Duration = Duration::from_secs(5);

/// Where the switch behind `api` listens for agents, if it does, and its channel's instance.
pub fn channel_path(api: &Client) -> anyhow::Result<Option<(PathBuf, Option<u64>)>> {
    let status = api.call("GET", "/api/v1/status", None)?;
    let channel = &status["cpu_channel"];
    let instance = channel["instance"]
        .as_str()
        .and_then(|i| u64::from_str_radix(i, 16).ok());
    Ok(channel["path"]
        .as_str()
        .map(|p| (PathBuf::from(p), instance)))
}

impl Cpu {
    /// Opens the CPU path of the switch behind `api` as `mode` says; `frames`: this agent
    /// takes the frames entries send to the CPU (one agent per switch may, over the channel).
    pub fn open(api: &Client, mode: CpuMode, frames: bool) -> anyhow::Result<Cpu> {
        if mode == CpuMode::Http {
            return Ok(Cpu {
                way: Way::Http(api.clone()),
            });
        }
        let opened = channel_path(api).and_then(|path| match path {
            Some((path, instance)) => Channel::open(&path, api.token.as_deref(), frames, instance)
                .with_context(|| format!("the CPU channel at {}", path.display())),
            None => bail!("the switch at {} has no CPU channel", api.api),
        });
        match (opened, mode) {
            (Ok(c), _) => Ok(Cpu {
                way: Way::Channel(c),
            }),
            (Err(e), CpuMode::Channel) => Err(e),
            (Err(e), _) if e.downcast_ref::<Refused>().is_some() => Err(e),
            (Err(e), _) => {
                eprintln!("{e:#}; using the API's HTTP routes");
                Ok(Cpu {
                    way: Way::Http(api.clone()),
                })
            }
        }
    }

    /// Whether this is the CPU channel (else HTTP).
    pub fn over_channel(&self) -> bool {
        matches!(self.way, Way::Channel(_))
    }

    /// Up to `max` frames sent to the CPU, oldest first, waiting at most `wait` for the first.
    pub fn frames(&mut self, max: usize, wait: Duration) -> anyhow::Result<Vec<CpuPacket>> {
        match &mut self.way {
            Way::Http(api) => {
                let wait_ms = wait.as_millis().min(u128::from(u64::MAX)) as u64;
                api.take_packets(max, wait_ms)?
                    .into_iter()
                    .map(|f| {
                        let frame = switch::control::unhex(&f.frame)
                            .map_err(|e| anyhow::anyhow!("a frame from the switch: {e}"))?;
                        Ok(CpuPacket {
                            in_port: f.in_port,
                            reason: if f.reason == "mirror" {
                                "mirror"
                            } else {
                                "to_cpu"
                            },
                            frame,
                        })
                    })
                    .collect()
            }
            Way::Channel(c) => c.frames(max, wait),
        }
    }

    /// Sends `frame` out of `port` as it is.
    pub fn send(&mut self, port: u16, frame: &[u8]) -> anyhow::Result<()> {
        match &mut self.way {
            Way::Http(api) => api.send_frame(port, frame),
            Way::Channel(c) => {
                c.catch_up()?;
                c.send(&ToSwitch::Send { port, frame })
            }
        }
    }

    /// A register: `user<N>` or a port's figure `port<N>.<figure>`.
    pub fn read(&mut self, name: &str) -> anyhow::Result<u64> {
        match &mut self.way {
            Way::Http(api) => Ok(api.register(name)?.value),
            Way::Channel(c) => c.ask(|id| ToSwitch::Read { id, name }),
        }
    }

    /// Writes a user register.
    pub fn write(&mut self, name: &str, value: u64) -> anyhow::Result<()> {
        match &mut self.way {
            Way::Http(api) => api.set_register(name, value).map(drop),
            Way::Channel(c) => c.ask(|id| ToSwitch::Write { id, name, value }).map(drop),
        }
    }
}

impl Channel {
    /// Opens the channel at `path`; `instance`, when the status gave one, must be the one
    /// the switch welcomes the agent with (else the socket is another switch's).
    fn open(
        path: &std::path::Path,
        token: Option<&str>,
        frames: bool,
        instance: Option<u64>,
    ) -> anyhow::Result<Channel> {
        let conn = SeqConn::connect(path)?;
        let uid = conn.peer_uid()?;
        if uid != 0 && uid != kvio::seqpacket::effective_uid() {
            bail!("the socket's owner is user {uid}, neither root nor this agent's user");
        }
        conn.set_write_timeout(Some(SEND_LIMIT))?;
        let mut c = Channel {
            conn,
            frames: VecDeque::new(),
            refused: None,
            next_id: 1,
            received: 0,
            buf: vec![0; MAX_MESSAGE],
            out: Vec::with_capacity(MAX_MESSAGE),
        };
        // The switch speaks first; the token goes only to the switch the status names.
        c.conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        let n = c
            .conn
            .recv(&mut c.buf)
            .context("waiting for the switch's welcome")?;
        match FromSwitch::decode(&c.buf[..n]) {
            Ok(FromSwitch::Welcome { instance: got, .. }) => {
                if let Some(want) = instance.filter(|&want| want != got) {
                    bail!(
                        "the socket is another switch's (its channel is {got:016x}, the \
                         status names {want:016x})"
                    );
                }
            }
            Ok(other) => bail!("the switch opened with {other:?}, not a welcome"),
            Err(_) if n == 0 => bail!("the switch closed the connection (too many agents?)"),
            Err(e) => bail!("the switch's welcome: {e}"),
        }
        c.send(&ToSwitch::Hello {
            token: token.unwrap_or("").as_bytes(),
            frames,
        })?;
        let n = c
            .conn
            .recv(&mut c.buf)
            .context("waiting for the switch's answer to the hello")?;
        match FromSwitch::decode(&c.buf[..n]) {
            Ok(FromSwitch::Accepted) => Ok(c),
            Ok(FromSwitch::Failed { message, .. }) => Err(Refused(message.to_string()).into()),
            Ok(other) => bail!("the switch answered the hello with {other:?}"),
            Err(_) if n == 0 => bail!("the switch closed the connection"),
            Err(e) => bail!("the switch's answer: {e}"),
        }
    }

    /// Sends the request `msg` makes with a fresh id, and waits for its answer.
    fn ask<'a>(&mut self, msg: impl FnOnce(u32) -> ToSwitch<'a>) -> anyhow::Result<u64> {
        self.catch_up()?;
        let id = self.next_id;
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        self.send(&msg(id))?;
        self.answer(id)
    }

    fn send(&mut self, msg: &ToSwitch) -> anyhow::Result<()> {
        msg.encode(&mut self.out);
        self.conn.send(&self.out).context("the CPU channel")
    }

    /// Takes in, without waiting, what the switch has sent (frames, a refused send), then
    /// returns a refusal of an earlier send as an error: a connection that only sends must
    /// still read, or the switch's answers would fill its socket.
    fn catch_up(&mut self) -> anyhow::Result<()> {
        for _ in 0..CATCH_UP {
            let before = self.received;
            self.take(None)?;
            if self.received == before {
                break;
            }
        }
        self.told()
    }

    /// A refusal of an earlier send, as an error.
    fn told(&mut self) -> anyhow::Result<()> {
        match self.refused.take() {
            Some(why) => bail!("the switch refused a frame: {why}"),
            None => Ok(()),
        }
    }

    /// Takes one message, waiting at most `wait` (none: not at all); frames are queued, a
    /// refused send kept for later. Returns an answer `(id, value or refusal)` if it was one.
    fn take(&mut self, wait: Option<Duration>) -> anyhow::Result<Option<Answer>> {
        let got = match wait {
            None => self.conn.try_recv(&mut self.buf),
            Some(w) => {
                self.conn.set_read_timeout(Some(w))?;
                self.conn.recv(&mut self.buf)
            }
        };
        let n = match got {
            Ok(0) => bail!("the switch closed the CPU channel"),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e).context("the CPU channel"),
        };
        self.received += 1;
        match FromSwitch::decode(&self.buf[..n]).context("a message from the switch")? {
            FromSwitch::Frame {
                in_port,
                reason,
                frame,
            } => {
                self.frames.push_back(CpuPacket {
                    in_port,
                    reason,
                    frame: frame.to_vec(),
                });
                Ok(None)
            }
            FromSwitch::Value { id, value } => Ok(Some((id, Ok(value)))),
            FromSwitch::Failed { id: 0, message } => {
                self.refused = Some(message.to_string());
                Ok(None)
            }
            FromSwitch::Failed { id, message } => Ok(Some((id, Err(message.to_string())))),
            FromSwitch::Welcome { .. } | FromSwitch::Accepted => {
                bail!("the switch said welcome twice")
            }
        }
    }

    /// Waits for the answer to request `id`.
    fn answer(&mut self, id: u32) -> anyhow::Result<u64> {
        let deadline = Instant::now() + ANSWER_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("the switch did not answer within {ANSWER_LIMIT:?}");
            }
            match self.take(Some(left))? {
                Some((got, result)) if got == id => {
                    return result.map_err(|why| anyhow::anyhow!("the switch refused: {why}"))
                }
                // An answer to a request given up on.
                Some(_) | None => {}
            }
        }
    }

    fn frames(&mut self, max: usize, wait: Duration) -> anyhow::Result<Vec<CpuPacket>> {
        self.catch_up()?;
        if self.frames.is_empty() {
            let deadline = Instant::now() + wait;
            while self.frames.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                self.take(Some(left))?;
            }
        }
        // Whatever else is there already, without waiting.
        while self.frames.len() < max {
            let before = self.received;
            self.take(None)?;
            if self.received == before {
                break;
            }
        }
        let n = max.min(self.frames.len());
        Ok(self.frames.drain(..n).collect())
    }
}

/// Messages taken in at most by one call before it goes on.
const CATCH_UP: usize = 1024;

/// An answer's id and its value or refusal.
type Answer = (u32, Result<u64, String>);

/// How long a read or write waits for its answer: the switch answers within a round of its
/// loop.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);
