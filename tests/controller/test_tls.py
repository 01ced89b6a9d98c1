"""The controller over mutual TLS, against each target started with BMv2's TLS options."""
import subprocess

import pytest

from controller.p4runtime import TLS, SwitchConnection, SwitchError
from mindp import progress, targets

from tests.target_params import TARGET_PARAMS


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=mindp test CA",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "1", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)
    return d


def tls_args(pki, key="server.key"):
    return ["--grpc-server-ssl", "--grpc-server-cacert", str(pki / "ca.pem"), "--grpc-server-cert",
            str(pki / "server.pem"), "--grpc-server-key", str(pki / key), "--grpc-server-with-client-auth"]


@pytest.fixture(params=TARGET_PARAMS)
def tls_switch(request, pki, tmp_path):
    cfg = targets.SwitchConfig(ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}",
                               log_file=str(tmp_path / "switch.log"), thrift_port=targets.free_port(),
                               grpc_args=tls_args(pki))
    with targets.SwitchProcess(request.param, cfg):
        yield cfg.grpc_addr


def test_mutual_tls_session_pushes_and_reads(pki, tls_switch):
    tls = TLS(cacert=str(pki / "ca.pem"), cert=str(pki / "client.pem"), key=str(pki / "client.key"))
    from p4src import artifacts

    with SwitchConnection(tls_switch, tls=tls) as sw:
        assert sw.is_primary
        sw.push_pipeline(artifacts.P4INFO, artifacts.BMV2_JSON)
        assert sw.read_entries() == []
        assert sw.check_pipeline()


def test_plaintext_or_unknown_client_is_refused_with_one_error(pki, tls_switch):
    with pytest.raises(SwitchError):
        SwitchConnection(tls_switch, timeout=2.0)
    with pytest.raises(SwitchError):  # the server verifies client certificates
        SwitchConnection(tls_switch, tls=TLS(cacert=str(pki / "ca.pem")), timeout=2.0)


def test_missing_credential_file_is_named(tmp_path):
    with pytest.raises(SwitchError, match="not found"):
        SwitchConnection("127.0.0.1:1", tls=TLS(cacert=str(tmp_path / "nope.pem")))


@pytest.mark.parametrize("bad, says", [
    (["--grpc-server-ssl"], "needs --grpc-server-cert and --grpc-server-key"),
    (["--grpc-server-cert", "x.pem"], "need --grpc-server-ssl"),
    (["--grpc-server-ssl", "--grpc-server-cert", "c", "--grpc-server-key", "k", "--grpc-server-with-client-auth"],
     "needs --grpc-server-cacert"),
])
def test_embedded_switch_tls_usage_errors(bad, says):
    cmd = targets.command("embedded", targets.SwitchConfig(ports={}))[:3] + ["--no-p4", "--", *bad]
    r = progress.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("key", ["missing.key", "ca.srl"])
def test_embedded_switch_names_an_unreadable_key(pki, key):
    cfg = targets.SwitchConfig(ports={}, grpc_addr=f"127.0.0.1:{targets.free_port()}", grpc_args=tls_args(pki, key))
    r = progress.run(targets.command("embedded", cfg), capture_output=True, text=True)
    assert r.returncode == 1 and key in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
