//! The certified OpenID Connect provider `oidc-provider` (Node.js, from npm), run by a test
//! with one client and the users it names. Its packages are installed from
//! `tests/support/oidc/package-lock.json` on first use.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::json;

pub struct OidcProvider {
    pub issuer: String,
    child: Child,
}

fn support_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/oidc")
}

/// Installs the provider's packages unless they are there.
fn install() {
    let dir = support_dir();
    if dir.join("node_modules/oidc-provider/package.json").exists() {
        return;
    }
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .status()
        .expect("npm runs (Node.js is needed for the sign-in tests)");
    assert!(status.success(), "npm ci in {} failed", dir.display());
}

impl OidcProvider {
    /// Starts the provider for client `client_id` returning to `redirect_uri`; `users` maps a
    /// login to its name and groups.
    pub fn start(
        client_id: &str,
        client_secret: &str,
        redirect_uri: &str,
        users: &[(&str, &str, &[&str])],
    ) -> OidcProvider {
        install();
        let users: serde_json::Map<String, serde_json::Value> = users
            .iter()
            .map(|(login, name, groups)| {
                (login.to_string(), json!({"name": name, "groups": groups}))
            })
            .collect();
        let config = json!({
            "client_id": client_id,
            "client_secret": client_secret,
            "redirect_uris": [redirect_uri],
            "users": users,
        });
        let mut child = Command::new("node")
            .arg("provider.mjs")
            .current_dir(support_dir())
            .env("OIDC_CONFIG", config.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node runs");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let issuer = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("the provider did not start: {line:?}"))
            .to_owned();
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        OidcProvider { issuer, child }
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
