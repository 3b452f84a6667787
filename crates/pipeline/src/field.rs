//! Lookup keys: which bytes of the frame and which metadata a table matches on.
//!
//! A key is the concatenation of its fields, each in network byte order. Reading never panics:
//! a byte range past the end of the frame makes the key absent and the table misses.

use crate::{FieldError, NUM_REGS};

/// Per-frame metadata, set by the caller before [`Pipeline::process`](crate::Pipeline::process)
/// and visible to (and partly writable by) the tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Port the frame arrived on.
    pub in_port: u16,
    /// Hash of the memcached key carried by the frame, computed by the caller; 0 if none.
    /// [`Action::Select`](crate::Action::Select) hands it to the chooser.
    pub key_hash: u32,
    /// Caller-defined flags (for example "parsed as a memcached request").
    pub flags: u32,
    /// Scratch registers, written by [`Action::SetReg`](crate::Action::SetReg).
    pub regs: [u32; NUM_REGS],
}

impl Meta {
    /// Metadata for a frame arriving on `in_port`, everything else zero.
    pub fn new(in_port: u16) -> Self {
        Meta {
            in_port,
            ..Meta::default()
        }
    }
}

/// One component of a lookup key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// `len` bytes of the frame starting at `offset` (from the start of the Ethernet header).
    Bytes { offset: u16, len: u8 },
    /// Like `Bytes`, but bytes past the end of the frame read as zero instead of making the key
    /// absent: for a window over a payload of varying length (the start of a memcached
    /// request, say) in a table that short frames must still reach.
    Padded { offset: u16, len: u8 },
    /// [`Meta::in_port`], 2 bytes.
    InPort,
    /// [`Meta::key_hash`], 4 bytes.
    KeyHash,
    /// [`Meta::flags`], 4 bytes.
    Flags,
    /// [`Meta::regs`]`[n]`, 4 bytes.
    Reg(u8),
}

impl Field {
    /// Width of this field in the key, in bytes.
    pub fn width(&self) -> usize {
        match self {
            Field::Bytes { len, .. } | Field::Padded { len, .. } => usize::from(*len),
            Field::InPort => 2,
            Field::KeyHash | Field::Flags | Field::Reg(_) => 4,
        }
    }

    /// Checks the field is well formed.
    pub(crate) fn validate(&self) -> Result<(), FieldError> {
        match *self {
            Field::Bytes { len: 0, offset } | Field::Padded { len: 0, offset } => {
                Err(FieldError::EmptyBytes { offset })
            }
            Field::Reg(n) if usize::from(n) >= NUM_REGS => Err(FieldError::Register(n)),
            _ => Ok(()),
        }
    }
}

/// Appends the key built from `fields` to `out`. Returns `false`, leaving `out` partly written,
/// if a byte range reaches past the end of `frame`.
///
/// `fields` must have been validated; `out` is expected to have enough capacity already so that
/// nothing is allocated.
pub(crate) fn extract(fields: &[Field], frame: &[u8], meta: &Meta, out: &mut Vec<u8>) -> bool {
    for f in fields {
        match *f {
            Field::Bytes { offset, len } => {
                let start = usize::from(offset);
                match frame.get(start..start + usize::from(len)) {
                    Some(bytes) => out.extend_from_slice(bytes),
                    None => return false,
                }
            }
            Field::Padded { offset, len } => {
                let start = usize::from(offset).min(frame.len());
                let end = (usize::from(offset) + usize::from(len)).min(frame.len());
                out.extend_from_slice(&frame[start..end]);
                let missing = usize::from(len) - (end - start);
                out.extend(std::iter::repeat_n(0, missing));
            }
            Field::InPort => out.extend_from_slice(&meta.in_port.to_be_bytes()),
            Field::KeyHash => out.extend_from_slice(&meta.key_hash.to_be_bytes()),
            Field::Flags => out.extend_from_slice(&meta.flags.to_be_bytes()),
            Field::Reg(n) => match meta.regs.get(usize::from(n)) {
                Some(r) => out.extend_from_slice(&r.to_be_bytes()),
                None => return false,
            },
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenates_in_network_order() {
        let frame = [0u8, 1, 2, 3, 4, 5];
        let meta = Meta {
            in_port: 0x0102,
            key_hash: 0xaabbccdd,
            flags: 7,
            regs: [0, 0, 0x11223344, 0, 0, 0, 0, 0, 0],
        };
        let fields = [
            Field::Bytes { offset: 4, len: 2 },
            Field::InPort,
            Field::KeyHash,
            Field::Flags,
            Field::Reg(2),
        ];
        let mut out = Vec::new();
        assert!(extract(&fields, &frame, &meta, &mut out));
        assert_eq!(
            out,
            [4, 5, 1, 2, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 7, 0x11, 0x22, 0x33, 0x44]
        );
        let width: usize = fields.iter().map(Field::width).sum();
        assert_eq!(width, out.len());
    }

    #[test]
    fn past_the_end_is_absent() {
        let frame = [0u8; 6];
        let mut out = Vec::new();
        assert!(!extract(
            &[Field::Bytes { offset: 5, len: 2 }],
            &frame,
            &Meta::default(),
            &mut out
        ));
        assert!(!extract(
            &[Field::Bytes {
                offset: u16::MAX,
                len: u8::MAX
            }],
            &frame,
            &Meta::default(),
            &mut out
        ));
    }

    #[test]
    fn padded_bytes_read_zero_past_the_end() {
        let frame = [1u8, 2, 3];
        let mut out = Vec::new();
        let fields = [
            Field::Padded { offset: 1, len: 4 },
            Field::Padded { offset: 9, len: 2 },
        ];
        assert!(extract(&fields, &frame, &Meta::default(), &mut out));
        assert_eq!(out, [2, 3, 0, 0, 0, 0]);
    }

    #[test]
    fn validation() {
        assert_eq!(
            Field::Bytes { offset: 3, len: 0 }.validate(),
            Err(FieldError::EmptyBytes { offset: 3 })
        );
        assert_eq!(Field::Reg(9).validate(), Err(FieldError::Register(9)));
        assert!(Field::Reg(7).validate().is_ok());
    }
}
