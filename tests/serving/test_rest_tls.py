"""REST over TLS and mutual TLS, with the certificate flags gRPC uses (--tls-cert and co.)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest
from serving_helpers import MODEL, free_port, install_version
from test_serving_server import pki  # noqa: F401 - the throwaway CA and certificates

from ampflow.serving.config import TlsConfig

pytestmark = pytest.mark.serving


def _get(url: str, context: ssl.SSLContext | None) -> int:
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        json.load(reply)
        return reply.status


@pytest.fixture
def tls_rest(start_server, model_store, tmp_path, pki):  # noqa: F811
    def _start(mutual: bool):
        base = tmp_path / MODEL
        install_version(model_store, base, 1)
        tls = TlsConfig(pki["server"], pki["server_key"], pki["ca"] if mutual else None)
        server = start_server(base, rest_api_port=free_port(), tls=tls)
        return f"{server.rest_address}/v1/models/{MODEL}"
    return _start


def test_rest_serves_https_with_the_grpc_certificate_and_refuses_plain_http(tls_rest, pki):  # noqa: F811
    address = tls_rest(mutual=False)
    trusting = ssl.create_default_context(cafile=str(pki["ca"]))
    assert _get(f"https://{address}", trusting) == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(f"http://{address}", None)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(f"https://{address}", ssl.create_default_context())  # the system CAs only


def test_rest_with_a_client_ca_requires_a_client_certificate(tls_rest, pki):  # noqa: F811
    address = tls_rest(mutual=True)
    anonymous = ssl.create_default_context(cafile=str(pki["ca"]))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        _get(f"https://{address}", anonymous)
    known = ssl.create_default_context(cafile=str(pki["ca"]))
    known.load_cert_chain(pki["client"], pki["client_key"])
    assert _get(f"https://{address}", known) == 200
