//! A real Prometheus for the tests: Debian's `prometheus` package (`.ci/run` installs it),
//! started on a loopback port with a configuration and a data directory of the test's.

use std::net::TcpListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A Prometheus process, stopped when dropped.
pub struct Process {
    _child: tokio::process::Child,
    pub url: String,
}

/// Starts `prometheus` with `config` and the TSDB in `data`, and `extra` flags.
pub fn start(config: &Path, data: &Path, extra: &[&str]) -> Process {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
        .port();
    let child = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .args(extra)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot start `prometheus` ({error}): this test needs a real Prometheus; \
                 install Debian's `prometheus` package (`apt-get install prometheus`, \
                 which .ci/run does)"
            )
        });
    Process {
        _child: child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

impl Process {
    /// Waits until Prometheus says it is ready to answer queries.
    pub async fn ready(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        let client = reqwest::Client::new();
        loop {
            let ready = client
                .get(format!("{}/-/ready", self.url))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "Prometheus never became ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
