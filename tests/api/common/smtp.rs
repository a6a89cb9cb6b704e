//! A real SMTP server for the mail tests: aiosmtpd, run by `tests/support/smtp_sink.py` as a
//! child process on 127.0.0.1, with a self-signed certificate for 127.0.0.1 and localhost.
//! It keeps every message it accepts, which the tests read back parsed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mail_parser::{MessageParser, MimeHeaders};

/// How long the sink may take to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How the sink secures its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmtpMode {
    Plain,
    /// Offers STARTTLS and refuses mail before it.
    StartTls,
    /// TLS from the first byte (SMTPS).
    ImplicitTls,
}

/// An attachment as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedAttachment {
    pub filename: String,
    /// `type/subtype`, without parameters.
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// A message as the server received it: its envelope and its parsed content.
#[derive(Debug, Clone)]
pub struct ReceivedMail {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    pub subject: String,
    /// The From address.
    pub from: String,
    /// The To addresses.
    pub to: Vec<String>,
    pub text: String,
    pub html: String,
    pub attachments: Vec<ReceivedAttachment>,
    pub raw: Vec<u8>,
}

/// The running sink; stopped when dropped.
pub struct SmtpSink {
    child: Child,
    /// Held open: the sink stops by itself when it closes, should this process die.
    _stdin: ChildStdin,
    dir: tempfile::TempDir,
    port: u16,
    mode: SmtpMode,
    auth: Option<(String, String)>,
    certificate_pem: String,
}

impl SmtpSink {
    /// Starts a sink in `mode`, requiring AUTH with `auth`'s user and password when given.
    pub fn start(mode: SmtpMode, auth: Option<(&str, &str)>) -> Self {
        let dir = tempfile::tempdir().expect("a directory for the SMTP sink");
        let certificate = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
        ])
        .expect("generating a self-signed certificate");
        let certificate_pem = certificate.cert.pem();
        let cert_file = dir.path().join("cert.pem");
        let key_file = dir.path().join("key.pem");
        std::fs::write(&cert_file, &certificate_pem).unwrap();
        std::fs::write(&key_file, certificate.signing_key.serialize_pem()).unwrap();
        let messages = dir.path().join("messages");
        let stderr_file = dir.path().join("stderr.txt");

        let mut command = Command::new(python());
        command
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/smtp_sink.py"))
            .arg("--dir")
            .arg(&messages)
            .arg("--mode")
            .arg(match mode {
                SmtpMode::Plain => "plain",
                SmtpMode::StartTls => "starttls",
                SmtpMode::ImplicitTls => "implicit",
            })
            .arg("--cert")
            .arg(&cert_file)
            .arg("--key")
            .arg(&key_file);
        if let Some((user, password)) = auth {
            command.args(["--user", user, "--password", password]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", python().display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();

        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = sender.send(line);
        });
        let line = receiver.recv_timeout(START_TIMEOUT).unwrap_or_default();
        let port = line
            .strip_prefix("ready ")
            .and_then(|port| port.trim().parse::<u16>().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let status = child.wait().ok();
            let stderr = std::fs::read_to_string(&stderr_file).unwrap_or_default();
            if status.and_then(|status| status.code()) == Some(3) {
                panic!(
                    "the SMTP sink needs aiosmtpd: run `pip install aiosmtpd` for {} \
                     (CI installs it into target/ci-venv)\n{stderr}",
                    python().display()
                );
            }
            panic!("the SMTP sink did not start (it printed {line:?}):\n{stderr}");
        };
        Self {
            child,
            _stdin: stdin,
            dir,
            port,
            mode,
            auth: auth.map(|(user, password)| (user.to_owned(), password.to_owned())),
            certificate_pem,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL for `Mailer::new`, with the credentials when the sink requires AUTH.
    pub fn url(&self) -> String {
        let credentials = match &self.auth {
            Some((user, password)) => {
                format!("{}:{}@", percent_encode(user), percent_encode(password))
            }
            None => String::new(),
        };
        let (scheme, query) = match self.mode {
            SmtpMode::Plain => ("smtp", "?tls=none"),
            SmtpMode::StartTls => ("smtp", "?tls=required"),
            SmtpMode::ImplicitTls => ("smtps", ""),
        };
        format!("{scheme}://{credentials}127.0.0.1:{}{query}", self.port)
    }

    /// The sink's self-signed certificate, to trust as an extra root.
    pub fn certificate_pem(&self) -> &[u8] {
        self.certificate_pem.as_bytes()
    }

    /// Every message received so far, in the order received.
    pub fn messages(&self) -> Vec<ReceivedMail> {
        let directory = self.dir.path().join("messages");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&directory)
            .map(|entries| {
                entries
                    .map(|entry| entry.unwrap().path())
                    .filter(|path| path.extension().is_some_and(|e| e == "eml"))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files.iter().map(|file| read_message(file)).collect()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python of CI's virtual environment when there is one, else `python3`.
fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ci-venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

fn read_message(file: &Path) -> ReceivedMail {
    let raw = std::fs::read(file).unwrap();
    let envelope: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file.with_extension("json")).unwrap()).unwrap();
    let message = MessageParser::default()
        .parse(&raw)
        .unwrap_or_else(|| panic!("{} is not a message", file.display()));
    let addresses = |address: Option<&mail_parser::Address>| -> Vec<String> {
        address
            .map(|address| {
                address
                    .iter()
                    .filter_map(|addr| addr.address().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let attachments = message
        .attachments()
        .map(|part| ReceivedAttachment {
            filename: part.attachment_name().unwrap_or_default().to_owned(),
            content_type: part
                .content_type()
                .map(|ct| match ct.subtype() {
                    Some(subtype) => format!("{}/{subtype}", ct.ctype()),
                    None => ct.ctype().to_owned(),
                })
                .unwrap_or_default(),
            bytes: part.contents().to_vec(),
        })
        .collect();
    ReceivedMail {
        mail_from: envelope["mail_from"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        rcpt_tos: envelope["rcpt_tos"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|rcpt| rcpt.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        subject: message.subject().unwrap_or_default().to_owned(),
        from: addresses(message.from())
            .into_iter()
            .next()
            .unwrap_or_default(),
        to: addresses(message.to()),
        text: message
            .body_text(0)
            .map(|text| text.into_owned())
            .unwrap_or_default(),
        html: message
            .body_html(0)
            .map(|html| html.into_owned())
            .unwrap_or_default(),
        attachments,
        raw,
    }
}
