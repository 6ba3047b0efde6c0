"""The quality probe: a fixed set of prompts answered greedily (temperature 0) by one ready
replica of each version; the canary must agree with stable.

Agreement of one prompt = length of the common prefix of the two answers / length of the
longer one (1.0 when both are empty): greedy decoding of the same weights gives the same text,
and a version that drifts is penalised from the first character it changes. The probe's
agreement is the mean over prompts; exact-match is reported beside it.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from rollouts.decision import ProbeResult

PROBE_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Name three primary colours.",
    "What is 12 plus 7?",
    "Give a short tip for staying healthy.",
)
PROBE_TENANT = "rollout-probe"  # the engine's fair-share unit and prefix-cache salt


@dataclass(frozen=True)
class ProbeTarget:
    model_name: str  # the model's name in the replica's Triton repository
    grpc_address: str
    tokenizer: Any  # inference.tokenization.PromptTokenizer


def prefix_agreement(a: str, b: str) -> float:
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    return common / longest


async def _answer(client, request_type, target: ProbeTarget, prompt: str, max_tokens: int,
                  timeout_s: float) -> str:
    messages = [{"role": "user", "content": prompt}]
    request = request_type(
        request_id=f"probe-{uuid.uuid4().hex}",
        model_name=target.model_name,
        prompt_text=target.tokenizer.apply_chat_template(messages, add_generation_prompt=True),
        prompt_token_ids=tuple(target.tokenizer.encode_chat(messages, add_generation_prompt=True)),
        max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=None, stop=(),
        priority=0, tenant=PROBE_TENANT,
    )

    async def collect() -> str:
        parts = []
        async for chunk in client.stream(target.grpc_address, request):
            parts.append(chunk.text)
            if chunk.final:
                break
        return "".join(parts)

    return await asyncio.wait_for(collect(), timeout_s)


async def run_probe(client, request_type, stable: ProbeTarget, canary: ProbeTarget, *,
                    prompts: tuple[str, ...] = PROBE_PROMPTS, max_tokens: int = 24,
                    timeout_s: float = 120.0) -> ProbeResult:
    """`client` is an inference ReplicaClient, `request_type` its ReplicaRequest (injected:
    this package does not import the request path). A replica failure is the canary's
    failure (agreement 0 for that prompt) or, on the stable side, makes the probe not run."""
    samples = []
    for prompt in prompts:
        stable_answer, canary_answer = await asyncio.gather(
            _answer(client, request_type, stable, prompt, max_tokens, timeout_s),
            _answer(client, request_type, canary, prompt, max_tokens, timeout_s),
            return_exceptions=True)
        if isinstance(stable_answer, BaseException):
            return ProbeResult(0.0, 0.0, 0, samples,
                               error=f"stable replica failed the probe: {stable_answer!r}")
        if isinstance(canary_answer, BaseException):
            score, canary_text = 0.0, f"<error: {canary_answer!r}>"
        else:
            score, canary_text = prefix_agreement(stable_answer, canary_answer), canary_answer
        samples.append({"prompt": prompt, "stable": stable_answer, "canary": canary_text,
                        "agreement": round(score, 4)})
    num = len(samples)
    return ProbeResult(
        agreement=sum(s["agreement"] for s in samples) / num if num else 0.0,
        exact_match=sum(s["stable"] == s["canary"] for s in samples) / num if num else 0.0,
        num_prompts=num, samples=samples)
