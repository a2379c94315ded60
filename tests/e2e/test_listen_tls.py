"""test_listen_tls.py - where devio-server listens and how: an IPv6 loopback address, a unix-domain socket,
and HTTPS (--tls-cert/--tls-key) checked against a self-signed certificate made here.
Start-up refusals are checked from the exit status and the message; every wait is bounded."""
import os
import shutil
import socket
import ssl
import stat
import subprocess
import time

import pytest

from client import devio_client

TOKEN = "l1sten-t0ken"


def start(servers, model, *args):
    return servers.start(model, [str(a) for a in args], env={"DEVIO_TOKEN": TOKEN}, token=TOKEN)


def one_step(c):
    """healthz, then a sequence and one greedy step over the client's connection."""
    assert c.healthz()
    seq = c.create_sequence()
    res = c.step({"rows": [{"seq": seq, "tokens": [1, 2, 3], "sample": {"temperature": 0}}]})
    assert res["rows"][0]["len"] == 3 and len(res["rows"][0]["tokens"]) == 1
    return seq


def read_all(sock, limit_s=5.0):
    """What sock reads until end of stream or reset, within limit_s."""
    sock.settimeout(limit_s)
    out = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return out


def refused_at_start(bins, model, tmp_path, *args):
    """Run devio-server with args; it must exit 1 before listening. Returns its stderr."""
    cmd = [str(bins.server), "--model", str(model), "--listen", "127.0.0.1:0",
           "--db", str(tmp_path / "refused.db"), "--adapters", str(tmp_path)] + [str(a) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    p = subprocess.run(cmd, capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert b"listening" not in p.stdout
    return p.stderr.decode(errors="replace")


# ---- IPv6 ---------------------------------------------------------------------------------

def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_ipv6_loopback(servers, tiny_model):
    srv = start(servers, tiny_model, "--listen", "[::1]:0", "--max-per-address", "1")
    assert srv.port > 0
    with devio_client.Client("http://[::1]:%d" % srv.port, token=TOKEN, timeout=30) as c:
        one_step(c)
        # The client's keep-alive connection is its address's one: a second from ::1 is refused.
        with socket.create_connection(("::1", srv.port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = read_all(s)
        assert got.startswith(b"HTTP/1.1 503 ")
        assert b'"code":"too_many_connections"' in got and b'"max_per_address":1' in got
        assert c.healthz()
    assert srv.stop() == 0


# ---- unix socket ----------------------------------------------------------------------------

def test_unix_socket(servers, tiny_model, tmp_path):
    path = tmp_path / "devio.sock"
    srv = start(servers, tiny_model, "--listen", "unix:%s" % path, "--max-per-address", "1")
    assert srv.port == 0  # "listening 0": a unix socket has no port
    st = os.lstat(path)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    url = "unix://%s" % path
    # A unix client has no address: --max-per-address does not apply to it.
    with devio_client.Client(url, token=TOKEN, timeout=30) as a, \
            devio_client.Client(url, token=TOKEN, timeout=30) as b:
        seq = one_step(a)
        assert b.healthz()
        t = a.launch({"rows": [{"seq": seq, "tokens": [4]}]})
        assert b.await_ticket(t, timeout_ms=10000)["rows"][0]["len"] == 4
    assert srv.stop() == 0
    assert not path.exists()


def test_unix_socket_path_taken(bins, servers, tiny_model, tmp_path):
    path = tmp_path / "devio.sock"
    # A stale socket (its server died without removing it) is replaced.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    srv = start(servers, tiny_model, "--listen", "unix:%s" % path)
    with devio_client.Client("unix://%s" % path, timeout=30) as c:
        assert c.healthz()
        # A second server on the same path is refused while the first answers there.
        err = refused_at_start(bins, tiny_model, tmp_path, "--listen", "unix:%s" % path)
        assert "unix:%s" % path in err and "a server is answering on that socket" in err
        assert c.healthz()
    assert srv.stop() == 0
    # Anything but a socket is left alone.
    path.write_text("not a socket\n")
    err = refused_at_start(bins, tiny_model, tmp_path, "--listen", "unix:%s" % path)
    assert "exists and is not a socket" in err
    assert path.read_text() == "not a socket\n"


# ---- TLS ---------------------------------------------------------------------------------

def make_cert(folder, name):
    """A self-signed certificate for localhost and 127.0.0.1 and its key, as PEM files:
    made with the openssl command when present, else Python's cryptography package."""
    cert, key = folder / (name + ".crt"), folder / (name + ".key")
    if shutil.which("openssl"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=60)
        return cert, key
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        pytest.skip("neither the openssl command nor Python's cryptography is installed")
    k = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
         .public_key(k.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.SubjectAlternativeName(
             [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
             critical=False)
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    return d, make_cert(d, "server"), make_cert(d, "other")


def test_https(servers, tiny_model, certs):
    _, (cert, key), (other_cert, _) = certs
    srv = start(servers, tiny_model, "--tls-cert", cert, "--tls-key", key)
    ctx = ssl.create_default_context(cafile=str(cert))
    with devio_client.Client("https://localhost:%d" % srv.port, token=TOKEN, timeout=30,
                             tls_context=ctx) as c:
        one_step(c)
        assert "devio_" in c.metrics()
    # The certificate is really checked: one the client does not trust is refused.
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            ssl.create_default_context(cafile=str(other_cert)).wrap_socket(
                s, server_hostname="localhost")
    # Plain HTTP to the TLS port gets no HTTP answer: the handshake fails and the server closes.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = read_all(s)
    assert not got.startswith(b"HTTP/"), got[:200]
    with devio_client.Client("https://localhost:%d" % srv.port, timeout=30, tls_context=ctx) as c:
        assert c.healthz()
    assert srv.stop() == 0


def test_https_connection_cap_closes(servers, tiny_model, certs):
    """Over the cap a TLS client is closed without the plain-text 503 it could not read."""
    _, (cert, key), _ = certs
    srv = start(servers, tiny_model, "--tls-cert", cert, "--tls-key", key,
                "--max-connections", "1")
    ctx = ssl.create_default_context(cafile=str(cert))
    with devio_client.Client("https://localhost:%d" % srv.port, timeout=30, tls_context=ctx) as c:
        assert c.healthz()  # holds the one connection (keep-alive)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                ctx.wrap_socket(s, server_hostname="localhost").recv(1)
        assert c.healthz()
    assert srv.stop() == 0


def test_tls_refused_at_start(bins, tiny_model, tmp_path, certs):
    d, (cert, key), (_, other_key) = certs
    missing = d / "missing.key"
    err = refused_at_start(bins, tiny_model, tmp_path, "--tls-cert", cert, "--tls-key", missing)
    assert "--tls-key file %s" % missing in err and "No such file" in err
    err = refused_at_start(bins, tiny_model, tmp_path, "--tls-cert", cert)
    assert "--tls-cert and --tls-key go together: --tls-key is missing" in err
    junk = d / "junk.key"
    junk.write_text("not a key\n")
    err = refused_at_start(bins, tiny_model, tmp_path, "--tls-cert", cert, "--tls-key", junk)
    assert "--tls-key file %s holds no PEM private key" % junk in err
    err = refused_at_start(bins, tiny_model, tmp_path, "--tls-cert", key, "--tls-key", key)
    assert "--tls-cert file %s holds no PEM certificate" % key in err
    # A key that is not the certificate's: refused when the HTTPS loop starts, naming both files.
    err = refused_at_start(bins, tiny_model, tmp_path, "--tls-cert", cert, "--tls-key", other_key)
    assert "--tls-cert %s and --tls-key %s" % (cert, other_key) in err
    # The environment twins work the same way.
    cmd = [str(bins.server), "--model", str(tiny_model), "--listen", "127.0.0.1:0",
           "--db", str(tmp_path / "env.db"), "--adapters", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIO_")}
    env["DEVIO_TLS_CERT"] = str(cert)
    p = subprocess.run(cmd, capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 1 and b"--tls-key is missing" in p.stderr
