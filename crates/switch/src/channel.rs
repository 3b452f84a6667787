//! The CPU channel's messages: what an agent on a switch's CPU path and the switch say to each
//! other over a local sequenced-packet socket, one message each, little-endian, as bytes.
//!
//! The switch speaks first: [`FromSwitch::Welcome`] names its channel's instance, which the
//! agent checks against the switch's status before it gives anything away. The agent then
//! says [`ToSwitch::Hello`] (the API's token, and whether it takes the frames the switch's
//! entries send to the CPU) and the switch answers [`FromSwitch::Accepted`], or
//! [`FromSwitch::Failed`] and closes. Then the agent sends frames out of ports
//! ([`ToSwitch::Send`], answered only when refused) and reads and writes registers
//! ([`ToSwitch::Read`], [`ToSwitch::Write`], each answered with its `id`); the switch sends
//! the frames its entries hand to the CPU ([`FromSwitch::Frame`]) as they come.
//!
//! Decoding checks every length against the message: a short, long or unknown message is an
//! error, never a panic or a guess.

/// What an agent says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToSwitch<'a> {
    /// The first message: the API's token (empty when the switch has none), and whether the
    /// frames for the CPU go to this agent.
    Hello { token: &'a [u8], frames: bool },
    /// Sends `frame` out of `port` as it is.
    Send { port: u16, frame: &'a [u8] },
    /// Reads a register: `user<N>` or a port's figure `port<N>.<figure>`.
    Read { id: u32, name: &'a str },
    /// Writes a user register.
    Write { id: u32, name: &'a str, value: u64 },
}

/// What the switch says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromSwitch<'a> {
    /// The first message, sent as the agent connects: the switch has `ports` ports, and its
    /// channel is `instance` (as its status says).
    Welcome { ports: u16, instance: u64 },
    /// The hello was accepted.
    Accepted,
    /// A frame an entry sent to the CPU (`to_cpu`) or copied to it (`mirror`).
    Frame {
        in_port: u16,
        reason: &'static str,
        frame: &'a [u8],
    },
    /// A register's value, after a read or a write.
    Value { id: u32, value: u64 },
    /// A request refused: `id` names a read or write, 0 a hello or a send.
    Failed { id: u32, message: &'a str },
}

/// Why a message could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("an empty message")]
    Empty,
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("message kind {kind}: {len} bytes, shorter than its fields")]
    Short { kind: u8, len: usize },
    #[error("message kind {0}: bytes past its last field")]
    Long(u8),
    #[error("a name or message that is not UTF-8")]
    Text,
    #[error("unknown frame reason {0}")]
    Reason(u8),
}

const HELLO: u8 = 1;
const SEND: u8 = 2;
const READ: u8 = 3;
const WRITE: u8 = 4;
const WELCOME: u8 = 16;
const FRAME: u8 = 17;
const VALUE: u8 = 18;
const FAILED: u8 = 19;
const ACCEPTED: u8 = 20;

const REASONS: [&str; 2] = ["to_cpu", "mirror"];

/// Reads the fields of one message in order.
struct Fields<'a> {
    kind: u8,
    len: usize,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(msg: &'a [u8]) -> Result<Fields<'a>, DecodeError> {
        let (&kind, rest) = msg.split_first().ok_or(DecodeError::Empty)?;
        Ok(Fields {
            kind,
            len: msg.len(),
            rest,
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Short {
                kind: self.kind,
                len: self.len,
            });
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut v = [0u8; 8];
        v.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(v))
    }

    /// A length-prefixed string.
    fn text(&mut self) -> Result<&'a str, DecodeError> {
        let n = usize::from(self.u16()?);
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Text)
    }

    /// A length-prefixed byte string.
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::from(self.u16()?);
        self.take(n)
    }

    /// The rest of the message.
    fn tail(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    fn end<T>(self, value: T) -> Result<T, DecodeError> {
        match self.rest.is_empty() {
            true => Ok(value),
            false => Err(DecodeError::Long(self.kind)),
        }
    }
}

/// Appends a length-prefixed string, cut to what a length of 16 bits holds.
fn put_text(out: &mut Vec<u8>, bytes: &[u8]) {
    let bytes = &bytes[..bytes.len().min(usize::from(u16::MAX))];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl<'a> ToSwitch<'a> {
    /// Writes the message into `out`, which is cleared first.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match *self {
            ToSwitch::Hello { token, frames } => {
                out.push(HELLO);
                out.push(u8::from(frames));
                put_text(out, token);
            }
            ToSwitch::Send { port, frame } => {
                out.push(SEND);
                out.extend_from_slice(&port.to_le_bytes());
                out.extend_from_slice(frame);
            }
            ToSwitch::Read { id, name } => {
                out.push(READ);
                out.extend_from_slice(&id.to_le_bytes());
                put_text(out, name.as_bytes());
            }
            ToSwitch::Write { id, name, value } => {
                out.push(WRITE);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
                put_text(out, name.as_bytes());
            }
        }
    }

    pub fn decode(msg: &'a [u8]) -> Result<ToSwitch<'a>, DecodeError> {
        let mut f = Fields::new(msg)?;
        match f.kind {
            HELLO => {
                let frames = f.u8()? != 0;
                let token = f.bytes()?;
                f.end(ToSwitch::Hello { token, frames })
            }
            SEND => {
                let port = f.u16()?;
                let frame = f.tail();
                Ok(ToSwitch::Send { port, frame })
            }
            READ => {
                let id = f.u32()?;
                let name = f.text()?;
                f.end(ToSwitch::Read { id, name })
            }
            WRITE => {
                let id = f.u32()?;
                let value = f.u64()?;
                let name = f.text()?;
                f.end(ToSwitch::Write { id, name, value })
            }
            k => Err(DecodeError::Kind(k)),
        }
    }
}

impl<'a> FromSwitch<'a> {
    /// Writes the message into `out`, which is cleared first.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match *self {
            FromSwitch::Welcome { ports, instance } => {
                out.push(WELCOME);
                out.extend_from_slice(&ports.to_le_bytes());
                out.extend_from_slice(&instance.to_le_bytes());
            }
            FromSwitch::Frame {
                in_port,
                reason,
                frame,
            } => {
                out.push(FRAME);
                out.extend_from_slice(&in_port.to_le_bytes());
                out.push(REASONS.iter().position(|&r| r == reason).unwrap_or(0) as u8);
                out.extend_from_slice(frame);
            }
            FromSwitch::Value { id, value } => {
                out.push(VALUE);
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            FromSwitch::Accepted => out.push(ACCEPTED),
            FromSwitch::Failed { id, message } => {
                out.push(FAILED);
                out.extend_from_slice(&id.to_le_bytes());
                put_text(out, message.as_bytes());
            }
        }
    }

    pub fn decode(msg: &'a [u8]) -> Result<FromSwitch<'a>, DecodeError> {
        let mut f = Fields::new(msg)?;
        match f.kind {
            WELCOME => {
                let ports = f.u16()?;
                let instance = f.u64()?;
                f.end(FromSwitch::Welcome { ports, instance })
            }
            FRAME => {
                let in_port = f.u16()?;
                let r = f.u8()?;
                let reason = *REASONS.get(usize::from(r)).ok_or(DecodeError::Reason(r))?;
                let frame = f.tail();
                Ok(FromSwitch::Frame {
                    in_port,
                    reason,
                    frame,
                })
            }
            VALUE => {
                let id = f.u32()?;
                let value = f.u64()?;
                f.end(FromSwitch::Value { id, value })
            }
            FAILED => {
                let id = f.u32()?;
                let message = f.text()?;
                f.end(FromSwitch::Failed { id, message })
            }
            ACCEPTED => f.end(FromSwitch::Accepted),
            k => Err(DecodeError::Kind(k)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_reads_back_as_written() {
        let frame = [1u8, 2, 3, 4, 5];
        let to = [
            ToSwitch::Hello {
                token: b"secret",
                frames: true,
            },
            ToSwitch::Hello {
                token: b"",
                frames: false,
            },
            ToSwitch::Send {
                port: 3,
                frame: &frame,
            },
            ToSwitch::Read {
                id: 7,
                name: "port1.queue_bytes",
            },
            ToSwitch::Write {
                id: u32::MAX,
                name: "user3",
                value: u64::MAX,
            },
        ];
        let mut buf = Vec::new();
        for m in &to {
            m.encode(&mut buf);
            assert_eq!(&ToSwitch::decode(&buf).unwrap(), m);
        }
        let from = [
            FromSwitch::Welcome {
                ports: 4,
                instance: 0x0123_4567_89ab_cdef,
            },
            FromSwitch::Frame {
                in_port: 2,
                reason: "mirror",
                frame: &frame,
            },
            FromSwitch::Frame {
                in_port: 0,
                reason: "to_cpu",
                frame: &[],
            },
            FromSwitch::Value { id: 9, value: 1234 },
            FromSwitch::Accepted,
            FromSwitch::Failed {
                id: 0,
                message: "port 9 does not exist",
            },
        ];
        for m in &from {
            m.encode(&mut buf);
            assert_eq!(&FromSwitch::decode(&buf).unwrap(), m);
        }
    }

    #[test]
    fn every_cut_or_padded_message_is_an_error() {
        let mut buf = Vec::new();
        ToSwitch::Write {
            id: 1,
            name: "user0",
            value: 5,
        }
        .encode(&mut buf);
        for n in 0..buf.len() {
            assert!(ToSwitch::decode(&buf[..n]).is_err(), "cut at {n}");
        }
        buf.push(0);
        assert_eq!(ToSwitch::decode(&buf), Err(DecodeError::Long(WRITE)));
        assert_eq!(ToSwitch::decode(&[99]), Err(DecodeError::Kind(99)));
        assert_eq!(ToSwitch::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(
            ToSwitch::decode(&[READ, 0, 0, 0, 0, 2, 0, 0xff, 0xfe]),
            Err(DecodeError::Text)
        );
        assert_eq!(
            FromSwitch::decode(&[FRAME, 0, 0, 9]),
            Err(DecodeError::Reason(9))
        );
        FromSwitch::Failed {
            id: 3,
            message: "no",
        }
        .encode(&mut buf);
        for n in 0..buf.len() {
            assert!(FromSwitch::decode(&buf[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn any_bytes_decode_without_panicking() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 24) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (seed >> (i % 8 * 8)) as u8).collect();
            let _ = ToSwitch::decode(&bytes);
            let _ = FromSwitch::decode(&bytes);
        }
    }
}
