//! The CPU channel: agents on the switch's CPU path (the network functions) take the frames
//! entries send to the CPU, send frames out of ports and read and write registers over a
//! local sequenced-packet socket, served on the forwarding thread itself (a
//! [`dataplane::Side`]). HTTP stays for control: tables, entries, groups.
//!
//! Who may connect: the socket is a file only its owner may open (mode 0600); a peer must run
//! as the switch's user or root (the kernel's credentials), and its first message must carry
//! the API's token when the switch has one. At most [`MAX_AGENTS`] are attached (a connection
//! that says no hello within [`HELLO_LIMIT`] is closed); one of them
//! may take the frames ([`ToSwitch::Hello`]`{frames: true}`); while it does, the API's
//! `GET /api/v1/packets` and its stream are refused (409), so the agent gets every frame.
//!
//! What is lost: nothing below the capacity. A frame waits in the switch's CPU queue
//! ([`switch::control::CPU_QUEUE`] frames) until the agent's socket takes it, so an agent may
//! fall that many frames behind (more, by what its socket holds) and still get every one in
//! order; past it frames are counted as `cpu_queue_full` drops. An agent that sends faster
//! than the switch answers is slowed by its socket: while [`REPLIES_HELD`] of its answers
//! wait to be taken the switch neither reads nor polls its requests.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use dataplane::Side;
use kv::Instant;
use kvio::seqpacket::{effective_uid, SeqConn, SeqListener, MAX_MESSAGE};
use switch::channel::{FromSwitch, ToSwitch};
use switch::{Emit, Switch};

/// Agents attached at most; one more is closed as soon as it connects.
pub const MAX_AGENTS: usize = 8;
/// Requests read from one agent per round, so that one cannot hold the loop.
const REQUESTS_PER_ROUND: usize = 64;
/// How long a connection may take to say hello before it is closed, so that connections that
/// never do cannot hold the agents' places.
pub const HELLO_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Answers waiting for an agent to take them, past which its requests are not read.
pub const REPLIES_HELD: usize = 256;
/// Bytes asked of the kernel for what waits for an agent (frames and answers); the kernel
/// gives at most `net.core.wmem_max` (about 200 KiB by default).
const AGENT_BUFFER: usize = 1 << 20;

/// What the channel has done, for the status and `/metrics`.
#[derive(Debug, Default)]
pub struct ChannelStatus {
    /// Where it listens, once it does.
    pub path: OnceLock<PathBuf>,
    /// This switch's channel, told in the welcome, so that an agent can check that the
    /// socket it opened is the one the switch's status names.
    pub instance: OnceLock<u64>,
    pub agents: AtomicU64,
    /// Frames handed to the agent that takes them.
    pub frames_to_agents: AtomicU64,
    /// Frames agents sent out of ports.
    pub frames_from_agents: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    /// Requests answered with a refusal (an unknown register, a port that does not exist).
    pub failed: AtomicU64,
    /// Connections refused (a stranger, a wrong token, too many agents) and messages that
    /// were not messages of the channel (the agent is then closed).
    pub refused: AtomicU64,
}

impl ChannelStatus {
    /// Its families of the Prometheus text exposition.
    pub fn metrics(&self, m: &mut api::metrics::Exposition) {
        use api::metrics::Kind;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        m.single(
            "kvswitch_cpu_channel_agents",
            Kind::Gauge,
            "Agents attached to the CPU channel.",
            get(&self.agents),
        );
        for (name, help, c) in [
            (
                "kvswitch_cpu_channel_frames_to_agents_total",
                "Frames for the CPU handed to an agent over the CPU channel.",
                &self.frames_to_agents,
            ),
            (
                "kvswitch_cpu_channel_frames_from_agents_total",
                "Frames agents sent out of ports over the CPU channel.",
                &self.frames_from_agents,
            ),
            (
                "kvswitch_cpu_channel_reads_total",
                "Register reads over the CPU channel.",
                &self.reads,
            ),
            (
                "kvswitch_cpu_channel_writes_total",
                "Register writes over the CPU channel.",
                &self.writes,
            ),
            (
                "kvswitch_cpu_channel_failed_total",
                "CPU channel requests the switch refused (an unknown register or port).",
                &self.failed,
            ),
            (
                "kvswitch_cpu_channel_refused_total",
                "CPU channel connections refused and agents closed for a bad message.",
                &self.refused,
            ),
        ] {
            m.single(name, Kind::Counter, help, get(c));
        }
    }

    pub fn json(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        serde_json::json!({
            "path": self.path.get(),
            "instance": self.instance.get().map(|i| format!("{i:016x}")),
            "agents": get(&self.agents),
            "frames_to_agents": get(&self.frames_to_agents),
            "frames_from_agents": get(&self.frames_from_agents),
            "reads": get(&self.reads),
            "writes": get(&self.writes),
            "failed": get(&self.failed),
            "refused": get(&self.refused),
        })
    }
}

struct Agent {
    conn: SeqConn,
    /// When it connected.
    since: Instant,
    /// Past its hello.
    welcomed: bool,
    /// Takes the frames for the CPU (set only once it is past its hello).
    frames: bool,
    /// Answers its socket had no room for yet.
    replies: VecDeque<Vec<u8>>,
    /// [`REPLIES_HELD`] answers wait: its requests are neither read nor polled.
    held: bool,
}

/// The listening socket and its agents, served by the forwarding loop.
pub struct Channel {
    listener: SeqListener,
    path: PathBuf,
    /// The socket file's device and inode, so that only this switch's file is removed.
    file: (u64, u64),
    token: Option<String>,
    agents: Vec<Agent>,
    status: Arc<ChannelStatus>,
    generation: u64,
    /// Told in the welcome and the status.
    instance: u64,
    /// Frames or answers wait on an agent's full socket.
    pending: bool,
    buf: Vec<u8>,
    out: Vec<u8>,
}

/// Where the default places are.
pub const DEFAULT_DIR: &str = "/run/kvswitch";

/// The default place: `/run/kvswitch/cpu-<pid>.sock`.
pub fn default_path() -> PathBuf {
    Path::new(DEFAULT_DIR).join(format!("cpu-{}.sock", std::process::id()))
}

/// Removes from `dir` the default-place sockets of switches that are gone, which a switch
/// killed outright could not remove itself: each `cpu-<pid>.sock` whose process does not run
/// and on which nobody listens. Returns how many it removed.
pub fn sweep_stale(dir: &Path) -> usize {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cpu-"))
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        let socket = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
        if socket && nobody_listens(&path) && std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether nobody listens on the socket at `path`: its switch is gone.
fn nobody_listens(path: &Path) -> bool {
    matches!(SeqConn::connect(path),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

impl Channel {
    /// Listens at `path` (made absolute, as agents find it in the status). A socket file left
    /// there by a switch that is gone (nobody listens on it) is replaced; anything else at the
    /// path, or a socket another switch listens on, is an error.
    pub fn bind(
        path: &Path,
        token: Option<String>,
        status: Arc<ChannelStatus>,
    ) -> anyhow::Result<Channel> {
        use anyhow::Context;
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let path = std::path::absolute(path)
            .with_context(|| format!("CPU channel: the path {}", path.display()))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("CPU channel: creating {}", dir.display()))?;
        }
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if !meta.file_type().is_socket() {
                anyhow::bail!(
                    "CPU channel: {} exists and is not a socket (set switch.cpu_socket)",
                    path.display()
                );
            }
            if !nobody_listens(&path) {
                anyhow::bail!(
                    "CPU channel: another switch's channel listens at {} (set \
                     switch.cpu_socket)",
                    path.display()
                );
            }
            std::fs::remove_file(&path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?;
        }
        let listener = SeqListener::bind(&path)
            .with_context(|| format!("CPU channel: listening at {}", path.display()))?;
        let meta = std::fs::symlink_metadata(&path)?;
        let instance = instance_id();
        let _ = status.path.set(path.clone());
        let _ = status.instance.set(instance);
        Ok(Channel {
            listener,
            path,
            file: (meta.dev(), meta.ino()),
            token,
            agents: Vec::new(),
            status,
            generation: 0,
            instance,
            pending: false,
            buf: vec![0; MAX_MESSAGE],
            out: Vec::with_capacity(MAX_MESSAGE),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn accept(&mut self, now: Instant, ports: usize) {
        loop {
            let conn = match self.listener.accept() {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("CPU channel: accept failed: {e}");
                    return;
                }
            };
            let uid = conn.peer_uid().ok();
            let me = effective_uid();
            if self.agents.len() >= MAX_AGENTS || !uid.is_some_and(|u| u == me || u == 0) {
                tracing::warn!(
                    ?uid,
                    agents = self.agents.len(),
                    "CPU channel: connection refused (a stranger, or {MAX_AGENTS} agents)"
                );
                self.status.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let _ = conn.set_send_buffer(AGENT_BUFFER);
            // The switch speaks first, so that the agent can check the instance before it
            // sends the token. A new socket has room for it.
            FromSwitch::Welcome {
                ports: ports.min(usize::from(u16::MAX)) as u16,
                instance: self.instance,
            }
            .encode(&mut self.out);
            if conn.send(&self.out).is_err() {
                continue;
            }
            self.agents.push(Agent {
                conn,
                since: now,
                welcomed: false,
                frames: false,
                replies: VecDeque::new(),
                held: false,
            });
            self.changed();
        }
    }

    fn changed(&mut self) {
        self.generation += 1;
        self.status
            .agents
            .store(self.agents.len() as u64, Ordering::Relaxed);
    }

    /// Reads agent `i`'s requests; returns whether it stays attached, and how many it read.
    fn read_agent(&mut self, i: usize, sw: &mut Switch, emit: &mut Vec<Emit>) -> (bool, usize) {
        let mut read = 0;
        while read < REQUESTS_PER_ROUND && self.agents[i].replies.len() < REPLIES_HELD {
            let n = match self.agents[i].conn.recv(&mut self.buf) {
                Ok(0) => return (false, read),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("CPU channel: an agent's message: {e}");
                    self.status.refused.fetch_add(1, Ordering::Relaxed);
                    return (false, read);
                }
            };
            read += 1;
            let msg = match ToSwitch::decode(&self.buf[..n]) {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("CPU channel: an agent sent a bad message ({e}); closed");
                    self.status.refused.fetch_add(1, Ordering::Relaxed);
                    return (false, read);
                }
            };
            let reply = match (self.agents[i].welcomed, msg) {
                (false, ToSwitch::Hello { token, frames }) => {
                    let refusal = if !self
                        .token
                        .as_ref()
                        .is_none_or(|t| api::server::same(token, t.as_bytes()))
                    {
                        Some("the token is wrong".to_string())
                    } else if frames && self_takes_frames(&self.agents) {
                        Some("another agent takes the frames for the CPU".to_string())
                    } else {
                        None
                    };
                    if let Some(why) = refusal {
                        self.status.refused.fetch_add(1, Ordering::Relaxed);
                        FromSwitch::Failed {
                            id: 0,
                            message: &why,
                        }
                        .encode(&mut self.out);
                        // The agent is closed at once; the refusal is its last message.
                        let _ = self.agents[i].conn.send(&self.out);
                        return (false, read);
                    }
                    let agent = &mut self.agents[i];
                    agent.welcomed = true;
                    agent.frames = frames;
                    if frames {
                        sw.set_channel_takes(true);
                    }
                    FromSwitch::Accepted.encode(&mut self.out);
                    Some(())
                }
                (false, _) | (true, ToSwitch::Hello { .. }) => {
                    tracing::warn!("CPU channel: an agent spoke out of turn; closed");
                    self.status.refused.fetch_add(1, Ordering::Relaxed);
                    return (false, read);
                }
                (true, ToSwitch::Send { port, frame }) => {
                    match sw.send_frame(port, frame.to_vec(), emit) {
                        Ok(()) => {
                            self.status
                                .frames_from_agents
                                .fetch_add(1, Ordering::Relaxed);
                            None
                        }
                        Err(e) => {
                            self.status.failed.fetch_add(1, Ordering::Relaxed);
                            FromSwitch::Failed {
                                id: 0,
                                message: &e.to_string(),
                            }
                            .encode(&mut self.out);
                            Some(())
                        }
                    }
                }
                (true, ToSwitch::Read { id, name }) => {
                    self.status.reads.fetch_add(1, Ordering::Relaxed);
                    answer(id, sw.read_register(name), &self.status, &mut self.out);
                    Some(())
                }
                (true, ToSwitch::Write { id, name, value }) => {
                    self.status.writes.fetch_add(1, Ordering::Relaxed);
                    let done = sw.write_register(name, value).map(|()| value);
                    answer(id, done, &self.status, &mut self.out);
                    Some(())
                }
            };
            if reply.is_some() {
                self.agents[i].replies.push_back(self.out.clone());
            }
        }
        (true, read)
    }

    /// Sends agent `i` the answers it waits for; false when it is gone.
    fn flush_replies(&mut self, i: usize) -> bool {
        let agent = &mut self.agents[i];
        while let Some(r) = agent.replies.front() {
            match agent.conn.send(r) {
                Ok(()) => {
                    agent.replies.pop_front();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.pending = true;
                    break;
                }
                Err(_) => return false,
            }
        }
        true
    }

    /// Hands the frames waiting for the CPU to the agent that takes them; false when it is
    /// gone.
    fn deliver(&mut self, i: usize, sw: &mut Switch) -> bool {
        let agent = &self.agents[i];
        if !agent.frames || !agent.replies.is_empty() {
            return true;
        }
        let mut gone = false;
        let mut full = false;
        let out = &mut self.out;
        let sent = sw.deliver_cpu(|p| {
            FromSwitch::Frame {
                in_port: p.in_port,
                reason: p.reason,
                frame: &p.frame,
            }
            .encode(out);
            match agent.conn.send(out) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    full = true;
                    false
                }
                Err(_) => {
                    gone = true;
                    false
                }
            }
        });
        self.status
            .frames_to_agents
            .fetch_add(sent as u64, Ordering::Relaxed);
        self.pending |= full;
        !gone
    }
}

/// A number no other switch's channel is likely to have: the process, the time and the
/// standard library's per-process random keys, hashed.
fn instance_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn self_takes_frames(agents: &[Agent]) -> bool {
    agents.iter().any(|a| a.frames)
}

fn answer(
    id: u32,
    result: Result<u64, switch::control::ControlError>,
    status: &ChannelStatus,
    out: &mut Vec<u8>,
) {
    match result {
        Ok(value) => FromSwitch::Value { id, value }.encode(out),
        Err(e) => {
            status.failed.fetch_add(1, Ordering::Relaxed);
            FromSwitch::Failed {
                id,
                message: &e.to_string(),
            }
            .encode(out)
        }
    }
}

impl Side<Switch> for Channel {
    fn fds(&self, out: &mut Vec<RawFd>) {
        out.push(self.listener.fd());
        out.extend(self.agents.iter().filter(|a| !a.held).map(|a| a.conn.fd()));
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn serve(&mut self, sw: &mut Switch, now: Instant, emit: &mut Vec<Emit>) -> bool {
        self.pending = false;
        let mut worked = false;
        let mut i = 0;
        // The attached agents first, so that the places of those gone are free for the
        // connections accepted after.
        while i < self.agents.len() {
            let (open, read) = self.read_agent(i, sw, emit);
            worked |= read > 0;
            let silent = !self.agents[i].welcomed
                && now.saturating_duration_since(self.agents[i].since) > HELLO_LIMIT;
            if silent {
                tracing::warn!(
                    "CPU channel: a connection said no hello in {HELLO_LIMIT:?}; closed"
                );
                self.status.refused.fetch_add(1, Ordering::Relaxed);
            }
            let open = open && !silent && self.flush_replies(i) && self.deliver(i, sw);
            if !open {
                let gone = self.agents.swap_remove(i);
                if gone.frames {
                    sw.set_channel_takes(false);
                }
                self.changed();
                continue;
            }
            let held = self.agents[i].replies.len() >= REPLIES_HELD;
            if held != self.agents[i].held {
                self.agents[i].held = held;
                self.generation += 1;
            }
            i += 1;
        }
        self.accept(now, sw.port_count());
        worked
    }

    fn pending(&self) -> bool {
        self.pending
    }
}

impl Drop for Channel {
    /// Removes the socket file, if it is still this switch's.
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_sockets_of_switches_that_are_gone_are_swept() {
        let dir = std::env::temp_dir().join(format!("kvswitch-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Past the largest PID Linux gives: no process runs it.
        let gone = dir.join("cpu-4194305.sock");
        drop(SeqListener::bind(&gone).unwrap());
        let alive = dir.join(format!("cpu-{}.sock", std::process::id()));
        let _listening = SeqListener::bind(&alive).unwrap();
        // Gone, but someone listens on it (a switch in another PID namespace).
        let elsewhere = dir.join("cpu-4194306.sock");
        let _elsewhere = SeqListener::bind(&elsewhere).unwrap();
        let not_a_socket = dir.join("cpu-4194307.sock");
        std::fs::write(&not_a_socket, b"x").unwrap();
        let other = dir.join("switch.toml");
        std::fs::write(&other, b"x").unwrap();
        assert_eq!(sweep_stale(&dir), 1);
        assert!(!gone.exists());
        for kept in [&alive, &elsewhere, &not_a_socket, &other] {
            assert!(kept.exists(), "{}", kept.display());
        }
        assert_eq!(sweep_stale(&dir.join("none")), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
