"""The probe the evaluator task uses: one ready replica of each version, over Triton gRPC,
prompts rendered with each version's own tokenizer."""
from __future__ import annotations

import asyncio

from django.conf import settings

from inference.replica_client import ReplicaRequest
from inference.tokenization import TokenizerCache
from inference.triton_client import TritonReplicaClient
from models_registry.models import Replica
from rollouts.models import Rollout
from rollouts.decision import ProbeResult
from rollouts.quality_probe import PROBE_PROMPTS, ProbeTarget, run_probe


class ReplicaProbe:
    def __init__(self, tokenizers: TokenizerCache, *, prompts: tuple[str, ...] = PROBE_PROMPTS,
                 timeout_s: float = 120.0):
        self._tokenizers = tokenizers
        self._prompts = prompts
        self._timeout_s = timeout_s

    def _target(self, rollout: Rollout, version) -> ProbeTarget | None:
        replica = (Replica.objects.filter(model_version=version, state=Replica.State.READY)
                   .order_by("pk").first())
        if replica is None:
            return None
        return ProbeTarget(model_name=rollout.model.name, grpc_address=replica.grpc_address,
                           tokenizer=self._tokenizers.get(version.tokenizer, version.weights_uri))

    def __call__(self, rollout: Rollout) -> ProbeResult:
        targets = {}
        for side, version in (("stable", rollout.stable_version), ("canary", rollout.canary_version)):
            try:
                targets[side] = self._target(rollout, version)
            except (OSError, ImportError, ValueError, KeyError) as exc:
                return ProbeResult(0.0, 0.0, 0, error=f"{side} tokenizer unavailable: {exc}")
            if targets[side] is None:
                return ProbeResult(0.0, 0.0, 0, error=f"no ready {side} replica ({version})")
        return asyncio.run(self._run(rollout, targets["stable"], targets["canary"]))

    async def _run(self, rollout: Rollout, stable: ProbeTarget, canary: ProbeTarget) -> ProbeResult:
        client = TritonReplicaClient(first_token_timeout=self._timeout_s,
                                     token_timeout=self._timeout_s,
                                     access_token=settings.REPLICA_ACCESS_TOKEN)
        try:
            return await run_probe(client, ReplicaRequest, stable, canary, prompts=self._prompts,
                                   max_tokens=rollout.probe_max_tokens, timeout_s=self._timeout_s)
        finally:
            await client.close()
