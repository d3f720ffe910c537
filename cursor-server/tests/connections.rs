//! Connections are bounded: a client that connects and sends nothing, trickles its headers or its
//! body, or leaves a keep-alive HTTP/1 or h2c connection idle is closed; runs opened by BidiAppend
//! alone are capped and the one past the cap, no place freeing while it waits, is refused
//! `resource_exhausted`. Real sockets; every
//! wait is for the server's action (a close, a response), bounded only by a generous deadline.

#[path = "support/fake_cursor.rs"]
mod fake_cursor;
#[path = "support/fake_provider.rs"]
mod fake_provider;
#[path = "support/fixtures.rs"]
mod fixtures;

use std::time::Duration;

use fake_cursor::FakeCursor;
use fake_provider::FakeProvider;
use fixtures::{TestServer, heartbeat};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Far beyond every bound the server is given here: reaching it means the server never acted.
const DEADLINE: Duration = Duration::from_secs(30);

/// Short enough to observe, long enough that a stalled scheduler on a loaded machine does not trip
/// them before the client's next step (a request right after connecting, the next append).
const SHORT_BOUNDS: &str = "header_read_timeout_secs = 2\nrequest_body_timeout_secs = 2\nconnection_idle_timeout_secs = 3\nmax_unattached_runs = 3\nunattached_wait_ms = 300";

async fn server() -> (FakeProvider, TestServer) {
    let provider = FakeProvider::start().await;
    let server = TestServer::start_in(
        &provider.base_url(),
        tempfile::tempdir().unwrap(),
        SHORT_BOUNDS,
    )
    .await;
    (provider, server)
}

/// Everything the server sends until it closes the connection.
async fn read_until_closed(tcp: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match tcp.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await
    .expect("the server closes the connection");
    received
}

/// Writes `bytes` one at a time, 100 ms apart, until the server stops taking them.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>) {
    tokio::spawn(async move {
        for byte in bytes.into_iter().cycle() {
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed() {
    let (_provider, server) = server().await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let received = read_until_closed(&mut tcp).await;
    assert!(received.is_empty());
}

#[tokio::test]
async fn trickled_headers_are_cut_off() {
    let (_provider, server) = server().await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (mut reader, writer) = tcp.into_split();
    trickle(
        writer,
        b"GET /healthz HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            .to_vec(),
    );
    let mut received = Vec::new();
    tokio::time::timeout(DEADLINE, reader.read_to_end(&mut received))
        .await
        .expect("the server closes the connection")
        .ok();
    assert!(
        !String::from_utf8_lossy(&received).contains("200 OK"),
        "{}",
        String::from_utf8_lossy(&received)
    );
}

#[tokio::test]
async fn a_trickled_bidi_append_body_is_refused() {
    let (_provider, server) = server().await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    writer
        .write_all(
            b"POST /aiserver.v1.BidiService/BidiAppend HTTP/1.1\r\nHost: x\r\nContent-Type: application/proto\r\nContent-Length: 100000\r\n\r\n",
        )
        .await
        .unwrap();
    trickle(writer, vec![0u8]);
    let mut received = Vec::new();
    tokio::time::timeout(DEADLINE, reader.read_to_end(&mut received))
        .await
        .expect("the server answers and closes")
        .ok();
    let text = String::from_utf8_lossy(&received);
    assert!(!text.contains("200 OK"), "{text}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_its_response() {
    let (_provider, server) = server().await;
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let received = read_until_closed(&mut tcp).await;
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

#[tokio::test]
async fn an_idle_h2c_connection_is_closed() {
    let (_provider, server) = server().await;
    let tcp = TcpStream::connect(server.addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let connection = tokio::spawn(connection);
    let request = http::Request::get(format!("http://{}/healthz", server.addr))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).expect("request");
    let response = response.await.expect("response");
    assert_eq!(response.status(), 200);
    drop(response);
    // The client keeps the connection open and idle: the server ends it.
    tokio::time::timeout(DEADLINE, connection)
        .await
        .expect("the server closes the idle h2c connection")
        .expect("connection task")
        .ok();
}

#[tokio::test]
async fn runs_opened_by_bidi_append_alone_are_capped() {
    let (_provider, server) = server().await;
    let cursor = FakeCursor::new(server.addr);
    for n in 0..3 {
        let accepted = cursor
            .append(&format!("req-unattached-{n}"), 0, &heartbeat())
            .await;
        assert_eq!(accepted.status(), 200, "run {n} is within the cap");
    }
    // A fourth waits for a place (its RunSSE, or another run's), none comes: it is refused once
    // the wait (`unattached_wait_ms`) is over.
    let refused = cursor.append("req-unattached-3", 0, &heartbeat()).await;
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "resource_exhausted");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_unattached_runs")),
        "{body}"
    );
    // A RunSSE attaching to one of them frees its place.
    let _sse = cursor.open_run_sse("req-unattached-0").await;
    let accepted = cursor.append("req-unattached-4", 0, &heartbeat()).await;
    assert_eq!(accepted.status(), 200, "an attached run no longer counts");
}
