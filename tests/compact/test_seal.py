"""Sealing: round trip, tampering of every kind, tenant binding, key rotation, key config."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compact.seal import Sealer, decode_key, key_id
from gateway.kernel.errors import InvalidEncryptedContent
from gateway.kernel.settings import CompactionSettings, ConfigError, load_settings

K1 = bytes(range(32))
K2 = bytes(range(100, 132))
PAYLOAD = {"v": 1, "id": "cmp_1", "summary": "The user likes cobalt. 日本語 ✓"}


def test_round_trip_and_envelope_shape() -> None:
    s = Sealer([K1])
    env = s.seal(PAYLOAD, "a")
    version, kid, blob = env.split(".")
    assert version == "v1" and kid == key_id(K1) and len(kid) == 8
    assert "=" not in blob and "+" not in blob and "/" not in blob
    assert "cobalt" not in env
    assert s.open(env, "a") == PAYLOAD


def test_every_seal_uses_a_fresh_nonce() -> None:
    s = Sealer([K1])
    assert s.seal(PAYLOAD, "a") != s.seal(PAYLOAD, "a")


def _flip(env: str, index: int) -> str:
    head, _, blob = env.rpartition(".")
    raw = bytearray(base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4)))
    raw[index % len(raw)] ^= 0x01
    return head + "." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda e: _flip(e, 0), id="flip-nonce"),
        pytest.param(lambda e: _flip(e, 20), id="flip-ciphertext"),
        pytest.param(lambda e: _flip(e, -1), id="flip-tag"),
        pytest.param(lambda e: e[:-4], id="truncated"),
        pytest.param(lambda e: e[:12], id="truncated-to-header"),
        pytest.param(lambda e: "v2" + e[2:], id="wrong-version"),
        pytest.param(lambda e: "v1.00000000." + e.split(".")[2], id="unknown-key-id"),
        pytest.param(lambda e: e + ".x", id="extra-part"),
        pytest.param(lambda e: e.replace(".", "", 1), id="missing-part"),
        pytest.param(lambda e: e + "=", id="padding"),
        pytest.param(lambda e: "not an envelope", id="garbage"),
        pytest.param(lambda e: "v1." + key_id(K1) + ".!!!!", id="bad-base64"),
    ],
)
def test_tampering_is_refused(mutate: object) -> None:
    s = Sealer([K1])
    env = s.seal(PAYLOAD, "a")
    with pytest.raises(InvalidEncryptedContent) as info:
        s.open(mutate(env), "a", param="input[3].encrypted_content")  # type: ignore[operator]
    assert info.value.status == 400
    assert info.value.code == "invalid_encrypted_content"
    assert info.value.param == "input[3].encrypted_content"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0))
def test_any_single_bit_flip_is_refused(index: int) -> None:
    s = Sealer([K1])
    with pytest.raises(InvalidEncryptedContent):
        s.open(_flip(s.seal(PAYLOAD, "a"), index), "a")


def test_a_sealed_non_object_is_refused() -> None:
    s = Sealer([K1])
    env = s.seal(PAYLOAD, "a")
    # Authentic but not a JSON object: build it with the same key directly.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = b"\x00" * 12
    body = AESGCM(K1).encrypt(nonce, b"[1,2]", Sealer._aad(key_id(K1), "a"))
    forged = env.rsplit(".", 1)[0] + "." + base64.urlsafe_b64encode(nonce + body).rstrip(b"=").decode()
    with pytest.raises(InvalidEncryptedContent):
        s.open(forged, "a")


def test_foreign_tenant_is_refused_with_the_same_message() -> None:
    s = Sealer([K1])
    env = s.seal(PAYLOAD, "a")
    with pytest.raises(InvalidEncryptedContent) as foreign:
        s.open(env, "b")
    with pytest.raises(InvalidEncryptedContent) as tampered:
        s.open(_flip(env, 30), "a")
    assert foreign.value.message == tampered.value.message  # no oracle telling causes apart


def test_tenant_names_cannot_collide_through_the_header() -> None:
    s = Sealer([K1])
    with pytest.raises(InvalidEncryptedContent):
        s.open(s.seal(PAYLOAD, "a"), "a\x00")


def test_rotation_new_key_encrypts_old_key_still_opens() -> None:
    old = Sealer([K1])
    rotated = Sealer([K2, K1])
    old_env = old.seal(PAYLOAD, "a")
    new_env = rotated.seal(PAYLOAD, "a")
    assert new_env.split(".")[1] == key_id(K2) == rotated.current_key_id
    assert rotated.open(old_env, "a") == PAYLOAD
    assert rotated.open(new_env, "a") == PAYLOAD
    retired = Sealer([K2])
    with pytest.raises(InvalidEncryptedContent):
        retired.open(old_env, "a")


def test_from_settings_decodes_standard_and_urlsafe_base64() -> None:
    key = bytes([0xFB] * 32)  # base64 has '+' and '/', urlsafe has '-' and '_'
    std = base64.b64encode(key).decode()
    url = base64.urlsafe_b64encode(key).decode().rstrip("=")
    a = Sealer.from_settings(CompactionSettings(keys=[std]))
    b = Sealer.from_settings(CompactionSettings(keys=[url]))
    assert a.current_key_id == b.current_key_id == key_id(key)
    assert b.open(a.seal(PAYLOAD, "t"), "t") == PAYLOAD


@pytest.mark.parametrize("size", [16, 24, 32])
def test_aes_key_sizes(size: int) -> None:
    key = decode_key(base64.b64encode(b"k" * size).decode(), "compaction.keys[0]")
    assert len(key) == size


@pytest.mark.parametrize(
    ("text", "says"),
    [("not base64!", "not valid base64"), (base64.b64encode(b"short").decode(), "16, 24 or 32 bytes")],
)
def test_bad_keys_fail_start_up_naming_the_field(text: str, says: str) -> None:
    # the settings refuse them (check-config and serve alike), before any Sealer is built
    with pytest.raises(ConfigError, match=r"compaction\.keys\.1: ") as info:
        load_settings(compaction={"keys": [base64.b64encode(K1).decode(), text]})
    assert says in str(info.value)
    with pytest.raises(ConfigError, match=r"compaction\.keys\[1\]") as info:
        decode_key(text, "compaction.keys[1]")
    assert says in str(info.value)


def test_no_keys_means_a_random_process_key() -> None:
    a = Sealer.from_settings(CompactionSettings())
    b = Sealer.from_settings(CompactionSettings())
    assert a.current_key_id != b.current_key_id
    with pytest.raises(InvalidEncryptedContent):
        b.open(a.seal(PAYLOAD, "t"), "t")
