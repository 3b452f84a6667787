//! One owner per port: a switch claims each interface it opens with an exclusive lock on a
//! file named after the interface and its network namespace. A second switch on the same
//! interface would see every frame too and handle it twice (a request answered twice, an
//! `incr` applied twice), so it is refused at start. The lock goes with the process, however
//! it ends.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where the claims live.
pub const CLAIM_DIR: &str = "/run/kvswitch/ports";

/// How long a claim waits for an owner that is exiting to let go.
const EXITING_OWNER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the process `pid` (as written in a claim) is gone or a zombie: exiting.
fn exiting(pid: &str) -> bool {
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// An interface this process owns until the claim is dropped.
#[derive(Debug)]
pub struct PortClaim {
    _file: File,
    path: PathBuf,
}

impl PortClaim {
    /// Claims `ifname` (of this process's network namespace) for this process. Fails with
    /// [`io::ErrorKind::AddrInUse`], naming the owner's PID, when another process holds it.
    pub fn take(ifname: &str) -> io::Result<PortClaim> {
        PortClaim::take_in(Path::new(CLAIM_DIR), ifname)
    }

    /// [`PortClaim::take`] with the claims kept in `dir`.
    pub fn take_in(dir: &Path, ifname: &str) -> io::Result<PortClaim> {
        if ifname.is_empty() || ifname.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{ifname}` is not an interface name"),
            ));
        }
        std::fs::create_dir_all(dir)?;
        // The namespace's inode tells apart interfaces of one name in two namespaces.
        let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
        let path = dir.join(format!("{netns}-{ifname}.lock"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        // An owner that is exiting (killed: its main thread a zombie while the others still
        // close their files) lets go within moments; one that runs is refused at once.
        let deadline = std::time::Instant::now() + EXITING_OWNER_WAIT;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err);
            }
            let mut owner = String::new();
            file.rewind()?;
            let _ = file.read_to_string(&mut owner);
            let owner = owner.trim().to_string();
            if exiting(&owner) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            let owner = if owner.is_empty() { "unknown" } else { &owner };
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "port `{ifname}` is owned by another switch (pid {owner}); two switches on \
                     one port would each handle every frame"
                ),
            ));
        }
        file.set_len(0)?;
        file.rewind()?;
        write!(file, "{}", std::process::id())?;
        file.flush()?;
        Ok(PortClaim { _file: file, path })
    }

    /// The file that holds the claim.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_of_a_port_is_refused_until_the_first_goes() {
        let dir = std::env::temp_dir().join(format!("kvswitch-claims-{}", std::process::id()));
        let first = PortClaim::take_in(&dir, "veth-x").unwrap();
        let err = PortClaim::take_in(&dir, "veth-x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        // Another port is free.
        let other = PortClaim::take_in(&dir, "veth-y").unwrap();
        drop(first);
        let again = PortClaim::take_in(&dir, "veth-x").unwrap();
        assert!(PortClaim::take_in(&dir, "a/b").is_err());
        drop((other, again));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
