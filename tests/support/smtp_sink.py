"""A real SMTP server for the mail tests, built on aiosmtpd.

It listens on 127.0.0.1, in plain text, with STARTTLS (required before MAIL) or with implicit
TLS, optionally requiring AUTH with one user and password. Each message it accepts is written
to the output directory as NNNN.eml (the raw bytes received) and NNNN.json (the envelope:
mail_from and rcpt_tos). It prints "ready PORT" once listening, and stops when its standard
input closes or it is killed.

    python smtp_sink.py --dir DIR [--port N] [--mode plain|starttls|implicit]
                        [--cert PEM --key PEM] [--user U --password P]

Port 0 (the default) lets the system choose a free port, which "ready" reports.
"""

import argparse
import asyncio
import json
import os
import ssl
import sys
import threading

try:
    from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword
except ImportError:
    sys.stderr.write(
        "aiosmtpd is not installed: run `pip install aiosmtpd` "
        "(CI installs it into target/ci-venv)\n"
    )
    sys.exit(3)


class Sink:
    """Writes each message and its envelope to a directory."""

    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        stem = os.path.join(self.directory, f"{self.count:04}")
        meta = {"mail_from": envelope.mail_from, "rcpt_tos": list(envelope.rcpt_tos)}
        # Written under a temporary name and renamed, so a reader never sees half a file;
        # the envelope first, so that a message's .eml never appears without it.
        write_atomically(stem + ".json", json.dumps(meta).encode())
        write_atomically(stem + ".eml", envelope.original_content)
        return "250 OK message stored"


def write_atomically(path, data):
    with open(path + ".part", "wb") as out:
        out.write(data)
    os.replace(path + ".part", path)


def authenticator_for(user, password):
    def authenticate(server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == user.encode()
            and auth_data.password == password.encode()
        )
        # handled=False: aiosmtpd answers a failure itself (535).
        return AuthResult(success=ok, handled=False)

    return authenticate


async def serve(args):
    loop = asyncio.get_running_loop()
    tls = None
    if args.mode != "plain":
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.cert, args.key)

    smtp_options = {
        "hostname": "localhost",
        "loop": loop,
        # The client waits at most 30 s; a test that hangs should not outlive it by much.
        "timeout": 60,
    }
    if args.mode == "starttls":
        smtp_options.update(tls_context=tls, require_starttls=True)
    if args.user is not None:
        smtp_options.update(
            authenticator=authenticator_for(args.user, args.password or ""),
            auth_required=True,
            # With implicit TLS the connection is encrypted before SMTP starts, which aiosmtpd
            # cannot see: it would then never offer AUTH. With STARTTLS it keeps insisting on
            # TLS before AUTH; plain text is for tests of plain text only.
            auth_require_tls=args.mode == "starttls",
        )

    # One sink for every connection, so that messages are numbered across connections.
    sink = Sink(args.dir)
    server = await loop.create_server(
        lambda: SMTP(sink, **smtp_options),
        host="127.0.0.1",
        port=args.port,
        ssl=tls if args.mode == "implicit" else None,
    )
    port = server.sockets[0].getsockname()[1]
    print(f"ready {port}", flush=True)

    stopped = asyncio.Event()

    def wait_for_stdin_to_close():
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stopped.set)

    threading.Thread(target=wait_for_stdin_to_close, daemon=True).start()
    async with server:
        await stopped.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--mode", choices=["plain", "starttls", "implicit"], default="plain")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--user")
    parser.add_argument("--password")
    args = parser.parse_args()
    if args.mode != "plain" and not (args.cert and args.key):
        parser.error(f"--mode {args.mode} needs --cert and --key")
    os.makedirs(args.dir, exist_ok=True)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
