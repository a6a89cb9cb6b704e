//! Headless Chromium driven over the Chrome DevTools Protocol, for tests that use the
//! dashboard as a person would: open a page, wait for it, read what it shows, click, and take
//! screenshots at a given width. Blocking: run it inside `spawn_blocking`.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How long a page may take to say it has loaded.
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Every URL the page asked for, in order.
    requested: Vec<String>,
    /// Messages the page logged as errors, and uncaught exceptions.
    errors: Vec<String>,
    /// Where downloads are saved.
    downloads: tempfile::TempDir,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium with a fresh profile and one blank tab of `width` × `height` CSS pixels.
    pub fn launch(width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium runs (apt-get install chromium)");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let endpoint = loop {
            let mut line = String::new();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "chromium exited before it listened"
            );
            if let Some(at) = line.find("ws://") {
                break line[at..].trim().to_owned();
            }
        };
        // Chromium keeps writing to stderr; a full pipe would stall it.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        let (socket, _) = tungstenite::connect(endpoint.as_str()).unwrap();
        let mut browser = Browser {
            child,
            socket,
            session: String::new(),
            next_id: 0,
            requested: Vec::new(),
            errors: Vec::new(),
            downloads: tempfile::tempdir().unwrap(),
            _profile: profile,
        };
        let saved_in = browser.downloads.path().display().to_string();
        browser.command(
            "Browser.setDownloadBehavior",
            json!({"behavior": "allow", "downloadPath": saved_in}),
        );
        let target = browser.command("Target.createTarget", json!({"url": "about:blank"}));
        let attached = browser.command(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in ["Page", "Runtime", "Network"] {
            browser.call(&format!("{domain}.enable"), json!({}));
        }
        browser.resize(width, height);
        browser
    }

    /// Sends a command to the browser itself and returns its result.
    fn command(&mut self, method: &str, params: Value) -> Value {
        self.send(method, params, None)
    }

    /// Sends a command to the page and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(method, params, Some(session))
    }

    fn send(&mut self, method: &str, params: Value, session: Option<String>) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .unwrap();
        loop {
            let Message::Text(text) = self.socket.read().unwrap() else {
                continue;
            };
            let reply: Value = serde_json::from_str(text.as_str()).unwrap();
            if reply["id"] == id {
                assert!(reply["error"].is_null(), "{method}: {}", reply["error"]);
                return reply["result"].clone();
            }
            self.observe(&reply);
        }
    }

    fn observe(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Network.requestWillBeSent") => self.requested.push(
                params["request"]["url"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            Some("Runtime.exceptionThrown") => {
                self.errors.push(params["exceptionDetails"].to_string())
            }
            Some("Runtime.consoleAPICalled") if params["type"] == "error" => {
                self.errors.push(params["args"].to_string())
            }
            _ => {}
        }
    }

    /// Sets the viewport to `width` × `height` CSS pixels; under 500 it is a phone's.
    pub fn resize(&mut self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500}),
        );
    }

    /// The value of a JavaScript expression in the page (awaited when it is a promise).
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true in the page; while it throws (say, before the element
    /// it reads is drawn) it counts as false.
    pub fn wait_for(&mut self, expression: &str) {
        let started = Instant::now();
        let check = format!(
            "(() => {{ try {{ return Boolean({expression}); }} catch {{ return false; }} }})()"
        );
        while self.eval(&check) != json!(true) {
            assert!(
                started.elapsed() < LOAD_TIMEOUT,
                "timed out waiting for {expression}: {}",
                self.dom()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Opens `url` afresh (from a blank page, so that a new fragment loads the page again) and
    /// waits until the dashboard says it has loaded what it shows.
    pub fn open(&mut self, url: &str) {
        self.visit(url);
        self.wait_loaded();
    }

    /// Opens `url` afresh, without waiting for anything.
    pub fn visit(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": "about:blank"}));
        self.wait_for(r#"location.href === "about:blank" && document.readyState === "complete""#);
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Waits for the dashboard's `data-loaded="true"`.
    pub fn wait_loaded(&mut self) {
        self.wait_for(r#"document.body && document.body.dataset.loaded === "true""#);
    }

    /// The page as HTML, as it is now.
    pub fn dom(&mut self) -> String {
        self.eval("document.documentElement.outerHTML")
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Clicks the centre of the element `selector` picks with the mouse, after scrolling it
    /// into view, as a person would; the element must be visible and not covered.
    pub fn click(&mut self, selector: &str) {
        let quoted = serde_json::to_string(selector).unwrap();
        let centre = self.eval(&format!(
            "(() => {{ const e = document.querySelector({quoted}); if (!e) return null;
               e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
               const x = r.left + r.width / 2, y = r.top + r.height / 2;
               const hit = document.elementFromPoint(x, y);
               return {{x, y, reachable: hit !== null && (hit === e || e.contains(hit))}}; }})()"
        ));
        assert!(!centre.is_null(), "nothing matches {selector}");
        assert_eq!(centre["reachable"], true, "{selector} is hidden or covered");
        let (x, y) = (centre["x"].clone(), centre["y"].clone());
        self.call(
            "Input.dispatchMouseEvent",
            json!({"type": "mouseMoved", "x": x, "y": y}),
        );
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Presses a key (`Tab`, `Enter`, `Escape`) as the keyboard would.
    pub fn press(&mut self, key: &str) {
        let code = match key {
            "Tab" => 9,
            "Enter" => 13,
            "Escape" => 27,
            other => panic!("no key code for {other}"),
        };
        for kind in ["rawKeyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": key, "code": key, "windowsVirtualKeyCode": code}),
            );
        }
    }

    /// Writes a PNG of the whole page, not only the viewport, to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let width = self.eval("document.documentElement.clientWidth");
        let height = self.eval("Math.ceil(document.documentElement.scrollHeight)");
        self.capture(
            json!({"x": 0, "y": 0, "width": width, "height": height, "scale": 1}),
            path,
        );
    }

    /// Writes a PNG of the part of the page from the top of the first element `selector`
    /// picks to the bottom of the last.
    pub fn screenshot_of(&mut self, selector: &str, path: &Path) {
        let quoted = serde_json::to_string(selector).unwrap();
        let area = self.eval(&format!(
            "(() => {{ const all = [...document.querySelectorAll({quoted})]; if (!all.length) return null;
               const top = all[0].getBoundingClientRect().top + scrollY - 8;
               const bottom = all[all.length - 1].getBoundingClientRect().bottom + scrollY + 8;
               return {{x: 0, y: Math.max(0, top), width: document.documentElement.clientWidth,
                        height: bottom - Math.max(0, top), scale: 1}}; }})()"
        ));
        assert!(!area.is_null(), "nothing matches {selector}");
        self.capture(area, path);
    }

    fn capture(&mut self, clip: Value, path: &Path) {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true, "clip": clip}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// The bytes of the file `name` once the browser has finished downloading it.
    pub fn downloaded(&mut self, name: &str) -> Vec<u8> {
        let path = self.downloads.path().join(name);
        let started = Instant::now();
        // Chromium writes to a temporary `.crdownload` name and renames it over the file
        // when it is complete; it may create the file empty first, as a placeholder.
        let in_progress = |dir: &std::path::Path| {
            std::fs::read_dir(dir).unwrap().any(|entry| {
                entry
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".crdownload")
            })
        };
        // Every file the tests download has content, so an empty one is the placeholder.
        let complete = |path: &std::path::Path| path.metadata().is_ok_and(|m| m.len() > 0);
        while !complete(&path) || in_progress(self.downloads.path()) {
            assert!(
                started.elapsed() < LOAD_TIMEOUT,
                "{name} was not downloaded"
            );
            self.eval("0");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::read(path).unwrap()
    }

    /// Every URL the page requested so far.
    pub fn requested(&self) -> &[String] {
        &self.requested
    }

    /// Errors the page logged or threw so far.
    pub fn errors(&self) -> &[String] {
        &self.errors
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
