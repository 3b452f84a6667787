//! A proxy named in the environment is never used: the API client (and the testbed's probes)
//! speak straight to the address, since a proxy could not reach loopback or a namespace's
//! address and would see the token. Alone in its binary, because it sets the environment.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

#[test]
fn a_proxy_in_the_environment_is_not_used() {
    // Nothing listens at port 1: a call that went to the proxy would fail.
    for var in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        std::env::set_var(var, "http://127.0.0.1:1");
    }
    std::env::remove_var("NO_PROXY");
    std::env::remove_var("no_proxy");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line.trim().is_empty() {
                break;
            }
        }
        let body = r#"{"ok":true}"#;
        let mut conn = conn;
        write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        request_line
    });
    let client = api::Client::new(addr, Some("secret".into()));
    let reply = client
        .call("GET", "/api/v1/status", None)
        .expect("a direct call");
    assert_eq!(reply["ok"], true);
    // The request line names the path alone, as one to the server itself does (a request
    // to a proxy names the whole URL).
    assert_eq!(
        server.join().unwrap().trim_end(),
        "GET /api/v1/status HTTP/1.1"
    );
}
