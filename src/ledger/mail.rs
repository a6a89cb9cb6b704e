//! Sends email over SMTP: a plain-text and an HTML body, with attachments when there are any,
//! to a mail server named by a URL. Errors tell a refusal that retrying cannot change from one
//! that it may, and neither they nor `Debug` ever show the server's password.

use std::fmt;
use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use percent_encoding::percent_decode_str;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// How long connecting may take, and how long the whole exchange for one message may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The port of `smtp://` URLs that name none: message submission (RFC 6409).
pub const SUBMISSION_PORT: u16 = 587;

/// The port of `smtps://` URLs that name none: submission over implicit TLS (RFC 8314).
pub const SUBMISSIONS_PORT: u16 = 465;

/// What stands in for the password wherever a URL is shown.
const MASK: &str = "***";

/// A file sent along with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The name the recipient's mail program shows and saves the file under.
    pub filename: String,
    /// Its MIME type, such as `text/csv`.
    pub content_type: String,
    pub bytes: Vec<u8>,
}

/// One message to send.
#[derive(Debug, Clone, Copy)]
pub struct Mail<'a> {
    /// Recipients, each an RFC 5322 mailbox (`ops@example.com` or `Ops <ops@example.com>`).
    pub to: &'a [String],
    pub subject: &'a str,
    /// The plain-text body, for mail programs that show no HTML.
    pub text: &'a str,
    /// The same content as HTML.
    pub html: &'a str,
    pub attachments: &'a [Attachment],
}

/// What is wrong with the mail server's URL, the sender's mailbox or the extra root
/// certificate. A URL in it has its password masked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailConfigError {
    #[error("the mail server URL {url} is not usable: {problem}")]
    Url {
        /// The URL as given, its password replaced by `***`.
        url: String,
        problem: String,
    },
    #[error("the sender {from:?} is not an RFC 5322 mailbox: {problem}")]
    From { from: String, problem: String },
    #[error("the extra root certificate is not usable: {0}")]
    Certificate(String),
}

/// Why a message was not sent. The texts come from the server or the network, with the
/// password removed should a server repeat it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MailError {
    /// The message cannot be built, such as a recipient that is not a mailbox: sending it
    /// again fails again.
    #[error("the message cannot be built: {0}")]
    Message(String),
    /// The server could not be reached, or the connection broke off.
    #[error("cannot connect to the mail server: {0}")]
    Connect(String),
    /// TLS could not be set up: an untrusted or mismatched certificate, a server that speaks
    /// no TLS, or one that does not offer STARTTLS when `?tls=required` insists on it.
    #[error("TLS with the mail server failed: {0}")]
    Tls(String),
    /// The server did not answer in time.
    #[error("the mail server did not answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    /// The server refused for good (a 5xx reply): wrong credentials, a recipient it does not
    /// accept, a message it will not take.
    #[error("the mail server refused: {code} {message}")]
    Permanent { code: u16, message: String },
    /// The server refused for now (a 4xx reply): it may accept the same message later.
    #[error("the mail server deferred: {code} {message}")]
    Transient { code: u16, message: String },
    /// The server lacks an extension the message or the credentials need (8BITMIME,
    /// SMTPUTF8, an authentication mechanism this client speaks).
    #[error("the mail server cannot take this message: {0}")]
    Unsupported(String),
    /// The server's answer could not be understood.
    #[error("the mail server's answer could not be understood: {0}")]
    Protocol(String),
}

impl MailError {
    /// Whether sending the same message again cannot succeed: a 5xx reply, a message that
    /// cannot be built, or a server lacking what the message needs. Everything else
    /// (connecting, TLS, time-outs, 4xx replies) is worth retrying, as the server or its
    /// configuration may be set right meanwhile.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Self::Permanent { .. } | Self::Message(_) | Self::Unsupported(_)
        )
    }
}

/// How the connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Security {
    /// STARTTLS when the server offers it, plain text otherwise.
    Opportunistic,
    /// STARTTLS, and no message when the server does not offer it.
    Required,
    /// Plain text.
    None,
    /// TLS from the first byte (`smtps://`).
    Implicit,
}

impl Security {
    fn describe(self) -> &'static str {
        match self {
            Self::Opportunistic => "STARTTLS when offered",
            Self::Required => "STARTTLS required",
            Self::None => "plain text",
            Self::Implicit => "implicit TLS",
        }
    }
}

/// The parts of a mail server URL.
#[derive(Clone, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
    security: Security,
    /// User and password, percent-decoded.
    credentials: Option<(String, String)>,
}

/// Sends messages through one SMTP server, from one sender. Each message goes over a
/// connection of its own.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// The URL as given, its password masked.
    url: String,
    security: Security,
    /// Kept only to remove it from any text a server sends back.
    password: Option<String>,
}

impl fmt::Debug for Mailer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailer")
            .field("url", &self.url)
            .field("security", &self.security.describe())
            .field("from", &self.from.to_string())
            .finish_non_exhaustive()
    }
}

impl Mailer {
    /// A mailer for the server at `url`, sending as `from`.
    ///
    /// `url` is `smtp://[user[:password]@]host[:port]` (port 587 by default; STARTTLS when
    /// the server offers it, `?tls=required` to insist on it, `?tls=none` for plain text) or
    /// `smtps://[user[:password]@]host[:port]` (implicit TLS, port 465 by default). User and
    /// password are percent-decoded. `from` is an RFC 5322 mailbox
    /// (`taskledger <alerts@example.com>`). Server certificates are checked against the
    /// Mozilla root store, plus each certificate in `extra_root_certificate_pem` (PEM) when
    /// given, so that an internal CA can be trusted.
    pub fn new(
        url: &str,
        from: &str,
        extra_root_certificate_pem: Option<&[u8]>,
    ) -> Result<Self, MailConfigError> {
        let endpoint = parse_url(url)?;
        let from_mailbox = from
            .parse::<Mailbox>()
            .map_err(|error| MailConfigError::From {
                from: from.to_owned(),
                problem: error.to_string(),
            })?;
        let extra_roots = extra_root_certificate_pem
            .map(parse_certificates)
            .transpose()?
            .unwrap_or_default();
        let tls_parameters = || {
            let mut builder = TlsParameters::builder(endpoint.host.clone());
            for certificate in &extra_roots {
                builder = builder.add_root_certificate(certificate.clone());
            }
            builder
                .build()
                .map_err(|error| MailConfigError::Certificate(error.to_string()))
        };
        let tls = match endpoint.security {
            Security::Opportunistic => Tls::Opportunistic(tls_parameters()?),
            Security::Required => Tls::Required(tls_parameters()?),
            Security::Implicit => Tls::Wrapper(tls_parameters()?),
            Security::None => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&endpoint.host)
            .port(endpoint.port)
            .tls(tls)
            .timeout(Some(TIMEOUT));
        if let Some((user, password)) = &endpoint.credentials {
            builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
        }
        Ok(Self {
            transport: builder.build(),
            from: from_mailbox,
            url: mask_password(url),
            security: endpoint.security,
            password: endpoint
                .credentials
                .map(|(_, password)| password)
                .filter(|password| !password.is_empty()),
        })
    }

    /// Sends one message: multipart/alternative with the text and the HTML body, wrapped in
    /// multipart/mixed with the attachments when there are any. Returns the server's final
    /// reply, code and text (`250 OK`).
    pub async fn send(&self, mail: &Mail<'_>) -> Result<String, MailError> {
        let message = self.compose(mail)?;
        let sent = tokio::time::timeout(TIMEOUT, self.transport.send(message)).await;
        match sent {
            Err(_) => Err(MailError::Timeout),
            Ok(Err(error)) => Err(self.classify(&error)),
            Ok(Ok(response)) => {
                let text = response.message().collect::<Vec<_>>().join(" ");
                Ok(self.scrub(format!("{} {text}", response.code()).trim_end()))
            }
        }
    }

    fn compose(&self, mail: &Mail<'_>) -> Result<Message, MailError> {
        if mail.to.is_empty() {
            return Err(MailError::Message("it has no recipient".to_owned()));
        }
        let mut builder = Message::builder()
            .from(self.from.clone())
            .subject(mail.subject)
            .message_id(None);
        for recipient in mail.to {
            let mailbox = recipient.parse::<Mailbox>().map_err(|error| {
                MailError::Message(format!(
                    "the recipient {recipient:?} is not a mailbox: {error}"
                ))
            })?;
            builder = builder.to(mailbox);
        }
        let bodies = MultiPart::alternative_plain_html(mail.text.to_owned(), mail.html.to_owned());
        let body = if mail.attachments.is_empty() {
            bodies
        } else {
            let mut mixed = MultiPart::mixed().multipart(bodies);
            for attachment in mail.attachments {
                mixed = mixed.singlepart(attachment_part(attachment)?);
            }
            mixed
        };
        builder
            .multipart(body)
            .map_err(|error| MailError::Message(error.to_string()))
    }

    /// Sorts a failure from the SMTP client into what the caller can act on.
    fn classify(&self, error: &lettre::transport::smtp::Error) -> MailError {
        let text = self.scrub(&describe(error));
        if let Some(code) = error.status() {
            let code = u16::from(code);
            let message = self.scrub(&source_text(error));
            return if error.is_permanent() {
                MailError::Permanent { code, message }
            } else {
                MailError::Transient { code, message }
            };
        }
        if error.is_timeout() {
            return MailError::Timeout;
        }
        if error.is_tls() || caused_by_tls(error) || text.contains("STARTTLS") {
            return MailError::Tls(text);
        }
        if error.is_client() {
            return MailError::Unsupported(text);
        }
        if error.is_response() {
            return MailError::Protocol(text);
        }
        MailError::Connect(text)
    }

    /// `text` with the password, should it appear, masked.
    fn scrub(&self, text: &str) -> String {
        match &self.password {
            Some(password) => text.replace(password.as_str(), MASK),
            None => text.to_owned(),
        }
    }
}

fn attachment_part(attachment: &Attachment) -> Result<SinglePart, MailError> {
    let content_type = ContentType::parse(&attachment.content_type).map_err(|error| {
        MailError::Message(format!(
            "the attachment {:?} has the content type {:?}: {error}",
            attachment.filename, attachment.content_type
        ))
    })?;
    // Bytes, not text, so that they are sent base64-encoded and arrive unchanged (text would
    // have its line endings made CRLF).
    Ok(
        lettre::message::Attachment::new(attachment.filename.clone())
            .body(attachment.bytes.clone(), content_type),
    )
}

/// The error's causes, outermost first, joined as `a: b: c`.
fn source_text(error: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    parts.join(": ")
}

/// The error and its causes.
fn describe(error: &lettre::transport::smtp::Error) -> String {
    let causes = source_text(error);
    if causes.is_empty() {
        error.to_string()
    } else {
        causes
    }
}

/// Whether a TLS library error is among the causes: a failed handshake reaches the SMTP
/// client as a connection error wrapping it.
fn caused_by_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(cause) = current {
        if cause.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return true;
        }
        current = cause.source();
    }
    false
}

fn parse_certificates(pem: &[u8]) -> Result<Vec<Certificate>, MailConfigError> {
    let ders = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| MailConfigError::Certificate(format!("not PEM: {error}")))?;
    if ders.is_empty() {
        return Err(MailConfigError::Certificate(
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".to_owned(),
        ));
    }
    ders.into_iter()
        .map(|der| {
            Certificate::from_der(der.to_vec())
                .map_err(|error| MailConfigError::Certificate(error.to_string()))
        })
        .collect()
}

fn parse_url(raw: &str) -> Result<Endpoint, MailConfigError> {
    let problem = |problem: String| MailConfigError::Url {
        url: mask_password(raw),
        problem,
    };
    let url = url::Url::parse(raw).map_err(|error| problem(error.to_string()))?;
    let mut tls = None;
    for (key, value) in url.query_pairs() {
        match &*key {
            "tls" if tls.is_none() => tls = Some(value.into_owned()),
            "tls" => return Err(problem("it gives tls= twice".to_owned())),
            other => {
                return Err(problem(format!(
                    "unknown parameter {other:?}; only tls= is taken"
                )));
            }
        }
    }
    let (security, default_port) = match (url.scheme(), tls.as_deref()) {
        ("smtp", None) => (Security::Opportunistic, SUBMISSION_PORT),
        ("smtp", Some("required")) => (Security::Required, SUBMISSION_PORT),
        ("smtp", Some("none")) => (Security::None, SUBMISSION_PORT),
        ("smtp", Some(other)) => {
            return Err(problem(format!(
                "tls={other} is not known; use tls=required or tls=none"
            )));
        }
        ("smtps", None) => (Security::Implicit, SUBMISSIONS_PORT),
        ("smtps", Some(_)) => {
            return Err(problem(
                "smtps:// always uses TLS; tls= applies to smtp:// only".to_owned(),
            ));
        }
        (scheme, _) => {
            return Err(problem(format!(
                "the scheme is {scheme:?}; use smtp:// or smtps://"
            )));
        }
    };
    let host = match url.host() {
        Some(url::Host::Domain(domain)) if !domain.is_empty() => domain.to_owned(),
        Some(url::Host::Ipv4(address)) => address.to_string(),
        Some(url::Host::Ipv6(address)) => address.to_string(),
        _ => return Err(problem("it names no host".to_owned())),
    };
    if !matches!(url.path(), "" | "/") {
        return Err(problem(
            "it has a path; a mail server URL takes none".to_owned(),
        ));
    }
    if url.fragment().is_some() {
        return Err(problem("it has a #fragment".to_owned()));
    }
    let decode = |part: &str, what: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(|decoded| decoded.into_owned())
            .map_err(|_| problem(format!("the {what} is not UTF-8 once percent-decoded")))
    };
    let credentials = match (url.username(), url.password()) {
        ("", None) => None,
        ("", Some(_)) => return Err(problem("it has a password but no user".to_owned())),
        (user, password) => Some((
            decode(user, "user")?,
            decode(password.unwrap_or(""), "password")?,
        )),
    };
    Ok(Endpoint {
        host,
        port: url.port().unwrap_or(default_port),
        security,
        credentials,
    })
}

/// `url` with whatever stands between the first `:` of its user part and the last `@` before
/// its host replaced by `***`. It works on text, so that a URL that does not parse is masked
/// too; when unsure it masks more, never less.
fn mask_password(url: &str) -> String {
    let authority_start = url.find("://").map_or(0, |index| index + 3);
    let rest = &url[authority_start..];
    let Some(at) = rest.rfind('@') else {
        return url.to_owned();
    };
    let user_info = &rest[..at];
    let Some(colon) = user_info.find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:{MASK}{}",
        &url[..authority_start],
        &user_info[..colon],
        &rest[at..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> Endpoint {
        parse_url(url).unwrap_or_else(|error| panic!("{url}: {error}"))
    }

    fn url_problem(url: &str) -> String {
        match parse_url(url) {
            Err(MailConfigError::Url { problem, .. }) => problem,
            other => panic!("{url}: expected a URL problem, got {:?}", other.is_ok()),
        }
    }

    #[test]
    fn urls_name_host_port_security_and_credentials() {
        let plain = endpoint("smtp://mail.example.com");
        assert_eq!(plain.host, "mail.example.com");
        assert_eq!(plain.port, SUBMISSION_PORT);
        assert_eq!(plain.security, Security::Opportunistic);
        assert_eq!(plain.credentials, None);

        let required = endpoint("smtp://alerts:s%40cret%3Ax@mail.example.com:2525?tls=required");
        assert_eq!(required.port, 2525);
        assert_eq!(required.security, Security::Required);
        assert_eq!(
            required.credentials,
            Some(("alerts".to_owned(), "s@cret:x".to_owned()))
        );

        assert_eq!(endpoint("smtp://relay?tls=none").security, Security::None);

        let implicit = endpoint("smtps://a%20b@[::1]");
        assert_eq!(implicit.host, "::1");
        assert_eq!(implicit.port, SUBMISSIONS_PORT);
        assert_eq!(implicit.security, Security::Implicit);
        assert_eq!(
            implicit.credentials,
            Some(("a b".to_owned(), String::new()))
        );
    }

    #[test]
    fn unusable_urls_say_what_is_wrong() {
        assert!(url_problem("http://mail.example.com").contains("smtp://"));
        assert!(url_problem("smtp://mail.example.com?tls=maybe").contains("tls=maybe"));
        assert!(url_problem("smtps://mail.example.com?tls=none").contains("smtp:// only"));
        assert!(url_problem("smtp://mail.example.com?port=25").contains("port"));
        assert!(url_problem("smtp://mail.example.com/x").contains("path"));
        assert!(url_problem("smtp://:pw@mail.example.com").contains("no user"));
        assert!(url_problem("smtp://").contains("host"));
    }

    #[test]
    fn passwords_are_masked_in_shown_urls() {
        assert_eq!(
            mask_password("smtp://alerts:hunter2@mail.example.com:587?tls=required"),
            "smtp://alerts:***@mail.example.com:587?tls=required"
        );
        // A password with an unescaped `@` or `/` still disappears whole.
        assert_eq!(
            mask_password("smtp://alerts:hun@ter/2@mail.example.com"),
            "smtp://alerts:***@mail.example.com"
        );
        assert_eq!(
            mask_password("smtp://mail.example.com:25"),
            "smtp://mail.example.com:25"
        );
        assert_eq!(mask_password("smtp://alerts@mail"), "smtp://alerts@mail");

        let error = Mailer::new(
            "smtp://alerts:hunter2@mail.example.com:notaport",
            "a@b.c",
            None,
        )
        .unwrap_err();
        for shown in [error.to_string(), format!("{error:?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("alerts:***@"), "{shown}");
        }
    }

    #[test]
    fn a_mailer_shows_no_password() {
        let mailer = Mailer::new(
            "smtps://alerts:hunter2@mail.example.com",
            "taskledger <alerts@example.com>",
            None,
        )
        .unwrap();
        let shown = format!("{mailer:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("smtps://alerts:***@mail.example.com"),
            "{shown}"
        );
        assert_eq!(mailer.scrub("535 no hunter2 here"), "535 no *** here");
    }

    #[test]
    fn senders_and_certificates_are_checked() {
        assert!(matches!(
            Mailer::new("smtp://mail.example.com", "not a mailbox", None),
            Err(MailConfigError::From { .. })
        ));
        assert!(matches!(
            Mailer::new(
                "smtp://mail.example.com",
                "a@example.com",
                Some(b"not a certificate")
            ),
            Err(MailConfigError::Certificate(_))
        ));
    }

    #[test]
    fn messages_are_alternative_bodies_mixed_with_attachments() {
        let mailer = Mailer::new(
            "smtp://mail.example.com",
            "taskledger <alerts@example.com>",
            None,
        )
        .unwrap();
        let to = [
            "Ops <ops@example.com>".to_owned(),
            "b@example.com".to_owned(),
        ];
        let mut mail = Mail {
            to: &to,
            subject: "Budget burn",
            text: "plain",
            html: "<p>html</p>",
            attachments: &[],
        };
        let message = mailer.compose(&mail).unwrap();
        let formatted = String::from_utf8(message.formatted()).unwrap();
        assert!(formatted.contains("multipart/alternative"));
        assert!(!formatted.contains("multipart/mixed"));
        assert_eq!(message.envelope().to().len(), 2);

        let attachments = [Attachment {
            filename: "costs.csv".to_owned(),
            content_type: "text/csv".to_owned(),
            bytes: b"a,b\n1,2\n".to_vec(),
        }];
        mail.attachments = &attachments;
        let formatted = String::from_utf8(mailer.compose(&mail).unwrap().formatted()).unwrap();
        assert!(formatted.contains("multipart/mixed"));
        assert!(formatted.contains("multipart/alternative"));
        assert!(formatted.contains("costs.csv"));

        let bad = ["nobody".to_owned()];
        mail.to = &bad;
        let error = mailer.compose(&mail).unwrap_err();
        assert!(error.is_permanent(), "{error}");
        mail.to = &[];
        assert!(matches!(mailer.compose(&mail), Err(MailError::Message(_))));
    }

    #[test]
    fn only_refusals_for_good_are_permanent() {
        let permanent = MailError::Permanent {
            code: 550,
            message: "no such user".to_owned(),
        };
        let transient = MailError::Transient {
            code: 451,
            message: "try later".to_owned(),
        };
        assert!(permanent.is_permanent());
        assert!(!transient.is_permanent());
        assert!(!MailError::Connect("refused".to_owned()).is_permanent());
        assert!(!MailError::Tls("unknown issuer".to_owned()).is_permanent());
        assert!(!MailError::Timeout.is_permanent());
    }
}
