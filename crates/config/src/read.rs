//! Reading a configuration file: a regular file of bounded size, never a FIFO, a device or a
//! stream without end (`--config /dev/zero`), which would wedge a reload or grow without bound.

use std::io::{self, Read};
use std::path::Path;

/// The largest configuration file read: far above any real pool (a thousand servers take
/// about 100 KiB), far below what would strain the daemon.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads `path` as UTF-8 text. Fails, with a message that says why, when it is not a regular
/// file (checked before it is opened, so a FIFO is never waited on), is larger than
/// [`MAX_FILE_BYTES`], or is not UTF-8.
pub fn read_file(path: &Path) -> io::Result<String> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a configuration is never read from a pipe or a device)",
        ));
    }
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_FILE_BYTES) as usize);
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {} MiB", MAX_FILE_BYTES >> 20),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// The first line of the file `path`, without its line end: a password or a token, read
/// with [`read_file`]'s bounds. `what` names the file in an error ("SASL password file"),
/// as does an empty first line.
pub fn secret_line(path: &Path, what: &str) -> Result<String, String> {
    let text =
        read_file(path).map_err(|e| format!("{what} {}: cannot read: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or("");
    if line.is_empty() {
        return Err(format!(
            "{what} {}: the first line is empty",
            path.display()
        ));
    }
    Ok(line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_the_first_line_and_never_empty() {
        let dir = std::env::temp_dir().join(format!("kvswitch-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "s3cret\nignored\n").unwrap();
        assert_eq!(secret_line(&file, "password file"), Ok("s3cret".into()));
        std::fs::write(&file, "\nlater\n").unwrap();
        let e = secret_line(&file, "password file").unwrap_err();
        assert!(e.contains("password file") && e.contains("empty"), "{e}");
        let e = secret_line(&dir.join("none"), "password file").unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = std::env::temp_dir().join(format!("kvswitch-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.toml");
        std::fs::write(&ok, "a = 1\n").unwrap();
        assert_eq!(read_file(&ok).unwrap(), "a = 1\n");
        let err = read_file(Path::new("/dev/zero")).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        assert!(read_file(&dir).is_err(), "a directory");
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            // Refused at once, not waited on.
            let err = read_file(&fifo).unwrap_err();
            assert!(err.to_string().contains("not a regular file"), "{err}");
        }
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_FILE_BYTES + 1) as usize]).unwrap();
        assert!(read_file(&big)
            .unwrap_err()
            .to_string()
            .contains("larger than"));
        let binary = dir.join("bin.toml");
        std::fs::write(&binary, [0xff, 0xfe]).unwrap();
        assert!(read_file(&binary)
            .unwrap_err()
            .to_string()
            .contains("UTF-8"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
