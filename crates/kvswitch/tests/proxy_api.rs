//! The proxy's control API: `kvswitch proxy --api` serves per-server counters on `/metrics` and
//! each server's health on `/api/v1/status`, and they follow what happens to the servers.

mod common;

use common::Running;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::proxy::{free_port, keys_on, ring, set_request, until_listening, Conn, Memcached};

fn get(api: SocketAddr, path: &str) -> String {
    let (status, body) = testbed::http_get(api, path).expect("the API answers");
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// The value of one sample line of the exposition, e.g. `name{pool="default",server="s1"}`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn metrics_and_status_follow_the_servers() {
    let mut servers = [Memcached::start(), Memcached::start(), Memcached::start()];
    let names = ["s1", "s2", "s3"];
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let dir = testbed::local::TempDir::new("kvswitch-proxy-api").expect("scratch directory");
    let mut config = format!(
        "[proxy]\nworkers = 1\napi = \"{api}\"\n\n[pool]\ntimeout_ms = 500\n\
         auto_eject_hosts = true\nserver_failure_limit = 1\nserver_retry_timeout_ms = 60000\n"
    );
    for (name, server) in names.iter().zip(&servers) {
        config.push_str(&format!(
            "\n[[pool.servers]]\naddr = \"{}\"\nname = \"{name}\"\n",
            server.addr()
        ));
    }
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, config).expect("write the configuration");
    let _proxy = Running(
        Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args(["proxy", "--listen", &listen.to_string(), "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[listen, api], "proxy");

    // Five sets on each server: each server's request and reply counters say five.
    let ring = ring();
    let mut conn = Conn::open(listen);
    for server in 0..3 {
        for key in keys_on(&ring, server, "api:", 5) {
            assert_eq!(
                conn.call(&set_request(&key, b"v"), |r| r.ends_with(b"\r\n")),
                b"STORED\r\n"
            );
        }
    }
    let metrics = get(api, "/metrics");
    api::metrics::lint(&metrics).unwrap_or_else(|e| panic!("the proxy's /metrics: {e}"));
    for name in names {
        let labels = format!("{{pool=\"default\",server=\"{name}\"}}");
        for family in ["requests_total", "replies_total"] {
            let series = format!("kvswitch_proxy_server_{family}{labels}");
            assert_eq!(sample(&metrics, &series), Some(5.0), "{series}\n{metrics}");
        }
        // Each reply's time is in the server's histogram: all five under its +Inf bucket and
        // its count, none in a bucket beyond a timeout, a time spent.
        let time = "kvswitch_proxy_server_request_seconds";
        let inf = format!("{time}_bucket{{pool=\"default\",server=\"{name}\",le=\"+Inf\"}}");
        assert_eq!(sample(&metrics, &inf), Some(5.0), "{metrics}");
        assert_eq!(
            sample(&metrics, &format!("{time}_count{labels}")),
            Some(5.0)
        );
        let sum = sample(&metrics, &format!("{time}_sum{labels}")).expect("the sum");
        assert!(sum > 0.0 && sum < 5.0, "{sum}");
        // The buckets are cumulative: never fewer under a larger bound.
        let prefix = format!("{time}_bucket{{pool=\"default\",server=\"{name}\",le=");
        let counts: Vec<f64> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(counts.len() > 10, "{metrics}");
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
        let up = format!("kvswitch_proxy_server_up{labels}");
        assert_eq!(sample(&metrics, &up), Some(1.0), "{metrics}");
    }
    assert_eq!(
        sample(
            &metrics,
            "kvswitch_proxy_client_connections{pool=\"default\"}"
        ),
        Some(1.0)
    );
    // The fifteen sets are timed as `set`; no other command has a series yet.
    let by_command = "kvswitch_proxy_command_request_seconds";
    let sets = format!("{by_command}_count{{pool=\"default\",command=\"set\"}}");
    assert_eq!(sample(&metrics, &sets), Some(15.0), "{metrics}");
    assert!(!metrics.contains("command=\"get\""), "{metrics}");

    // s2 dies: the next request for one of its keys fails and ejects it.
    servers[1].kill();
    let key = &keys_on(&ring, 1, "api:", 1)[0];
    let reply = conn.call(format!("get {key}\r\n").as_bytes(), |r| {
        r.ends_with(b"\r\n")
    });
    assert!(
        reply.starts_with(b"SERVER_ERROR"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let metrics = get(api, "/metrics");
    let s2 = "{pool=\"default\",server=\"s2\"}";
    assert_eq!(
        sample(&metrics, &format!("kvswitch_proxy_server_up{s2}")),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &metrics,
            &format!("kvswitch_proxy_server_ejections_total{s2}")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, &format!("kvswitch_proxy_server_errors_total{s2}")),
        Some(1.0)
    );
    // The failed get is timed too, as `get`: its reply, an error, was the client's.
    let gets = format!("{by_command}_count{{pool=\"default\",command=\"get\"}}");
    assert_eq!(sample(&metrics, &gets), Some(1.0), "{metrics}");

    let status: serde_json::Value =
        serde_json::from_str(&get(api, "/api/v1/status")).expect("status is JSON");
    let health: Vec<(String, String)> = status["proxy"]["pools"][0]["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["health"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        health,
        vec![
            ("s1".to_owned(), "up".to_owned()),
            ("s2".to_owned(), "ejected".to_owned()),
            ("s3".to_owned(), "up".to_owned()),
        ]
    );
}

/// `request` sent to `api` as it is written: the reply's status (0 for none).
fn status_of(api: SocketAddr, request: &str) -> u16 {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::net::TcpStream::connect(api) else {
        return 0;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = conn.write_all(request.as_bytes());
    let mut reply = String::new();
    let _ = conn.read_to_string(&mut reply);
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn slow_and_cross_origin_clients_of_the_api_leave_the_proxy_serving() {
    let server = Memcached::start();
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let dir = testbed::local::TempDir::new("kvswitch-proxy-api-guard").expect("scratch directory");
    let config = format!(
        "[proxy]\nworkers = 1\napi = \"{api}\"\napi_max_connections = 4\n\
         api_header_timeout_ms = 1000\n\n[pool]\ntimeout_ms = 500\n\n\
         [[pool.servers]]\naddr = \"{}\"\nname = \"s1\"\n",
        server.addr()
    );
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, config).expect("write the configuration");
    let _proxy = Running(
        Command::new(env!("CARGO_BIN_EXE_kvswitch"))
            .args(["proxy", "--listen", &listen.to_string(), "--config"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the proxy"),
    );
    until_listening(&[listen, api], "proxy");
    // `listening` took a connection; let its place go.
    thread::sleep(Duration::from_millis(100));

    // A page of another origin, curl's default type, a rebound name: refused, nothing added.
    let add = r#"{"addr": "127.0.0.1:1", "name": "s9"}"#;
    let post = |headers: &str| {
        status_of(
            api,
            &format!(
                "POST /api/v1/pool/servers HTTP/1.1\r\nConnection: close\r\n{headers}\
                 Content-Length: {}\r\n\r\n{add}",
                add.len()
            ),
        )
    };
    assert_eq!(
        post(&format!(
            "Host: {api}\r\nOrigin: http://evil.example\r\nContent-Type: text/plain\r\n"
        )),
        403
    );
    assert_eq!(
        post(&format!(
            "Host: {api}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        )),
        415
    );
    assert_eq!(
        post(&format!(
            "Host: evil.example:{0}\r\nOrigin: http://evil.example:{0}\r\nContent-Type: application/json\r\n",
            api.port()
        )),
        403
    );
    let pool = get(api, "/api/v1/pool");
    assert!(!pool.contains("s9"), "{pool}");

    // Slow clients take the API's four places and no more; the proxy serves on.
    let started = Instant::now();
    let slow: Vec<std::net::TcpStream> = (0..40)
        .filter_map(|_| {
            let mut conn = std::net::TcpStream::connect(api).ok()?;
            let _ = std::io::Write::write_all(&mut conn, b"GET /metrics HTTP/1.1\r\nHost: ");
            Some(conn)
        })
        .collect();
    assert_eq!(slow.len(), 40);
    let mut conn = Conn::open(listen);
    for i in 0..20 {
        assert_eq!(
            conn.call(&set_request(&format!("guard:{i}"), b"v"), |r| r
                .ends_with(b"\r\n")),
            b"STORED\r\n"
        );
    }
    // Within the header timeout, the API answers again.
    let bound = Duration::from_millis(1000) + Duration::from_secs(2);
    loop {
        if let Ok((200, _)) = testbed::http_get(api, "/api/v1/status") {
            break;
        }
        assert!(
            started.elapsed() < bound,
            "the API did not answer within {bound:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let metrics = get(api, "/metrics");
    assert!(
        sample(
            &metrics,
            "kvswitch_api_refused_total{reason=\"connections\"}"
        )
        .is_some_and(|n| n >= 36.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "kvswitch_api_refused_total{reason=\"header_timeout\"}"
        ),
        Some(4.0),
        "{metrics}"
    );
    drop(slow);
}
