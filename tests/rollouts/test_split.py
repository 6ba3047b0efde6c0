"""The sticky split: pure functions, no database."""
from inference.canary import choose_version, sticky_key
from inference.endpoints import ENDPOINTS
from inference.schemas import parse_request
from rollouts.selectors import LiveRollout
from inference.canary_split import NUM_BUCKETS, bucket, to_canary
from models_registry.selectors import ServingVersion

KEYS = [f"conversation-{i}" for i in range(20_000)]


def share(rollout_id: int, percent: float, tenant_id: int = 1) -> float:
    return sum(to_canary(rollout_id, tenant_id, k, percent) for k in KEYS) / len(KEYS)


def test_same_key_same_bucket_every_time():
    first = [bucket(7, 1, k) for k in KEYS[:500]]
    assert first == [bucket(7, 1, k) for k in KEYS[:500]]
    assert all(0 <= b < NUM_BUCKETS for b in first)


def test_share_matches_the_percent():
    for percent in (5, 25, 50):
        assert abs(share(3, percent) - percent / 100) < 0.01, percent
    assert share(3, 0) == 0.0
    assert share(3, 100) == 1.0


def test_raising_the_share_keeps_canary_keys_on_the_canary():
    at = {p: {k for k in KEYS if to_canary(11, 1, k, p)} for p in (5, 25, 50, 100)}
    assert at[5] <= at[25] <= at[50] <= at[100]
    assert len(at[5]) < len(at[25]) < len(at[50]) < len(at[100])


def test_rollouts_and_tenants_pick_different_keys():
    one = {k for k in KEYS if to_canary(1, 1, k, 50)}
    two = {k for k in KEYS if to_canary(2, 1, k, 50)}
    other_tenant = {k for k in KEYS if to_canary(1, 2, k, 50)}
    # Independent halves overlap on about a quarter of the keys, not half.
    assert abs(len(one & two) / len(KEYS) - 0.25) < 0.02
    assert abs(len(one & other_tenant) / len(KEYS) - 0.25) < 0.02


def chat(messages, **extra):
    return parse_request(ENDPOINTS["chat"], {"model": "m", "messages": messages, **extra})


def test_sticky_key_follows_the_conversation():
    turn1 = chat([{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"}])
    turn2 = chat([{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Tell me a joke"}])
    other = chat([{"role": "user", "content": "Something else"}])
    assert sticky_key(turn1, None, None) == sticky_key(turn2, None, "key-2")
    assert sticky_key(turn1, None, None) != sticky_key(other, None, None)
    # The client's own conversation id wins over the opening.
    assert sticky_key(turn1, "c-1", None) == sticky_key(other, "c-1", None) == "conversation:c-1"


def test_sticky_key_of_prompts_uses_the_idempotency_key_then_the_prompt():
    a = parse_request(ENDPOINTS["completions"], {"model": "m", "prompt": "Once upon"})
    b = parse_request(ENDPOINTS["completions"], {"model": "m", "prompt": "A different prompt"})
    assert sticky_key(a, None, "k1") == sticky_key(b, None, "k1")
    assert sticky_key(a, None, None) != sticky_key(b, None, None)


def version(pk: int) -> ServingVersion:
    return ServingVersion("m", pk, pk, "w", "bytes", 1024, "least_outstanding_tokens")


def test_choose_version():
    stable, canary = version(1), version(2)
    everything = LiveRollout(rollout_id=5, percent=100.0, stable_version_id=1, canary=canary)
    nothing = LiveRollout(rollout_id=5, percent=0.0, stable_version_id=1, canary=canary)
    assert choose_version(stable, None, 1, "k").target == stable
    chosen = choose_version(stable, everything, 1, "k")
    assert (chosen.target, chosen.fallback, chosen.rollout_id) == (canary, stable, 5)
    assert choose_version(stable, nothing, 1, "k") == choose_version(stable, None, 1, "k")
    # A rollout against another stable version (stale cache after a promotion) is ignored.
    stale = LiveRollout(rollout_id=5, percent=100.0, stable_version_id=9, canary=canary)
    assert choose_version(stable, stale, 1, "k").target == stable
