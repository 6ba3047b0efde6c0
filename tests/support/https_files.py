"""A real HTTPS file server for tests: a private CA made with `cryptography`, a server
certificate for one IP address (127.0.0.1 by default) signed by it, and python's http.server over TLS serving one directory
from a thread. `ca_file` is what a client must trust; `requests` lists the GETs served as (client address,
path).

`hold` (a threading.Event) makes every download trickle: the server sends the headers and the
first `HELD_AFTER` bytes, then waits for `hold` to be set before sending the rest (a slow
download that a test ends when it chooses); `trickling` is set once a download is held."""
from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for the IP address `host`, server key) as PEM files
    in `directory`."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("test weights CA")).issuer_name(_name("test weights CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    return paths


HELD_AFTER = 64 << 10
HOLD_LIMIT_S = 120  # a guard: a held download ends anyway after this long


class HttpsFiles:
    def __init__(self, root: Path, cert_dir: Path, host: str = "127.0.0.1",
                 hold: threading.Event | None = None):
        self.ca_file, cert, key = make_certificates(cert_dir, host)
        self.requests: list[tuple[str, str]] = []
        self.trickling = threading.Event()
        files = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                files.requests.append((self.client_address[0], self.path))
                super().do_GET()

            def copyfile(self, source, outputfile):
                if hold is None:
                    return super().copyfile(source, outputfile)
                outputfile.write(source.read(HELD_AFTER))
                outputfile.flush()
                files.trickling.set()
                hold.wait(HOLD_LIMIT_S)
                return super().copyfile(source, outputfile)

        self._server = ThreadingHTTPServer((host, 0), partial(Handler, directory=str(root)))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.base_url = f"https://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "HttpsFiles":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
