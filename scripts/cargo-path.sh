# Sourced by the scripts: puts Rust's cargo on PATH when it is installed but not there, as under
# sudo, whose PATH leaves out the invoking user's ~/.cargo/bin.
if ! command -v cargo >/dev/null 2>&1; then
    for dir in "${CARGO_HOME:-$HOME/.cargo}/bin" \
        "$(getent passwd "${SUDO_USER:-root}" | cut -d: -f6)/.cargo/bin"; do
        if [ -x "$dir/cargo" ]; then
            export PATH="$dir:$PATH"
            break
        fi
    done
fi
