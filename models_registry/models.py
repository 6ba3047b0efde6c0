"""The catalogue: what can be served (Model, ModelVersion), how each version is to be scaled
(ScalingPolicy) and where it runs (Node, Replica).

The request path reads these rows (inference routes to `ready` replicas); the fleet (fleet/)
writes Node and Replica rows and acts on ScalingPolicy; rollouts (rollouts/) change versions'
states. See docs/architecture.md, "Layering".
"""
from __future__ import annotations

from django.db import models


class Model(models.Model):
    """A name customers send as `model`; also the model's name in the Triton repository."""

    class RoutingPolicy(models.TextChoices):
        # The names of inference.policies.POLICIES (a test keeps the two lists equal).
        BALANCED = "balanced"  # outstanding tokens + free KV blocks + prefix overlap
        PREFIX_AFFINITY = "prefix_affinity"
        LEAST_OUTSTANDING_TOKENS = "least_outstanding_tokens"
        ROUND_ROBIN = "round_robin"  # a baseline only

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True, default="")
    # Public models are open to every tenant; others only to `tenants`.
    is_public = models.BooleanField(default=True)
    tenants = models.ManyToManyField("tenants.Tenant", blank=True, related_name="models")
    # Read by the request path through a cache of REGISTRY_CACHE_TTL_SECONDS: an admin change
    # reaches every process within that time.
    routing_policy = models.CharField(max_length=64, choices=RoutingPolicy.choices,
                                      default=RoutingPolicy.BALANCED)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    class State(models.TextChoices):
        STAGING = "staging"
        ACTIVE = "active"  # the newest active version serves the model's traffic
        RETIRED = "retired"

    class TokenizerKind(models.TextChoices):
        WEIGHTS = "weights"  # the tokenizer stored with the weights (GGUF / HF directory)
        BYTES = "bytes"  # UTF-8 bytes + ChatML: for tests and fake replicas only
        STORED = "stored"  # stored in the registry (StoredTokenizer): web hosts lack the weights

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    version_number = models.PositiveIntegerField()  # 1, 2, ... within its model
    # A path, or `package:<python package>/<file>` for weights shipped inside a package.
    weights_uri = models.CharField(max_length=500)
    # Required for https:// weights: node agents download them once and check this hash.
    weights_sha256 = models.CharField(max_length=64, blank=True, default="")
    tokenizer = models.CharField(
        max_length=16, choices=TokenizerKind.choices, default=TokenizerKind.WEIGHTS
    )
    quantization = models.CharField(max_length=32, blank=True, default="")
    hardware = models.JSONField(default=dict, blank=True)  # e.g. {"accelerator": "cpu", "memory_gib": 1}
    context_length = models.PositiveIntegerField(default=2048)
    # What one replica needs: its devices (GPUs on a GPU node; engine processes on a CPU node)
    # and the device memory of its weights and of the KV cache it asks for (0 = not declared;
    # the KV cache size is passed to the engine as --kv-cache-bytes). Placement on GPU nodes
    # puts a replica on `tensor_parallel_degree` free GPUs of one node, each holding its share.
    tensor_parallel_degree = models.PositiveSmallIntegerField(default=1)
    weights_memory_mib = models.PositiveIntegerField(default=0)
    kv_cache_mib = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model__name", "-version_number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "version_number"], name="unique_model_version")
        ]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version_number}"

    @property
    def device_memory_mib(self) -> int:
        """Device memory one replica needs on each of its GPUs (weights + KV cache, sharded)."""
        degree = max(1, self.tensor_parallel_degree)
        return -(-(self.weights_memory_mib + self.kv_cache_mib) // degree)


class StoredTokenizer(models.Model):
    """A version's tokenizer as a bundle (replica/tokenizer_bundle.py), read from its weights
    once at registration: web hosts tokenize prompts with it and never need the weights."""

    model_version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE,
                                         related_name="stored_tokenizer")
    bundle = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"tokenizer of {self.model_version}"


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    zone = models.CharField(max_length=64, blank=True, default="")
    address = models.CharField(max_length=200, blank=True, default="")
    accelerator = models.CharField(max_length=64, blank=True, default="cpu")
    is_schedulable = models.BooleanField(default=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # Capacity the node agent announced (CPU slots stand for GPUs here); 0 = not an agent's node.
    cpu_slots = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    # GPUs the agent discovered (fleet/gpus.py): [{"index", "uuid", "name", "memory_mib"}].
    gpus = models.JSONField(default=list, blank=True)
    # Set when heartbeats stopped and the node was presumed lost; cleared when it registers again.
    lost_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    @property
    def queue(self) -> str:
        """The Celery queue its agent consumes."""
        return f"node.{self.name}"

    def __str__(self) -> str:
        return self.name


class Replica(models.Model):
    """One Triton server process serving one model version."""

    class State(models.TextChoices):
        LOADING = "loading"
        READY = "ready"  # the only state the router sends requests to
        DRAINING = "draining"
        FAILED = "failed"
        STOPPED = "stopped"

    model_version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="replicas")
    node = models.ForeignKey(Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="replicas")
    grpc_address = models.CharField(max_length=200, blank=True)  # host:port
    metrics_address = models.CharField(max_length=200, blank=True, default="")  # host:port
    state = models.CharField(max_length=16, choices=State.choices, default=State.LOADING)
    zone = models.CharField(max_length=64, blank=True, default="")
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Placed by the fleet (a node agent starts and stops it, and alone promotes it to ready after
    # a warm-up request); False for replicas registered by hand (`registerreplica`).
    managed = models.BooleanField(default=False)
    cpu_slots = models.PositiveIntegerField(default=0)  # capacity reserved on its node
    memory_mib = models.PositiveIntegerField(default=0)
    # The node's GPUs it holds (their indexes; CUDA_VISIBLE_DEVICES) and its memory on each.
    gpu_indices = models.JSONField(default=list, blank=True)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    load_seconds = models.FloatField(null=True, blank=True)  # start -> ready, measured by the agent
    server_pid = models.IntegerField(null=True, blank=True)  # tritonserver's pid on its node

    class Meta:
        ordering = ["model_version", "grpc_address"]
        constraints = [
            # A placed replica has no address until its agent picks ports.
            models.UniqueConstraint(
                fields=["grpc_address"],
                condition=~models.Q(state__in=["stopped", "failed"]) & ~models.Q(grpc_address=""),
                name="unique_live_replica_address")
        ]

    def __str__(self) -> str:
        return f"{self.model_version} @ {self.grpc_address} ({self.state})"


class ScalingPolicy(models.Model):
    """How one model version scales. A version without a policy (or with `enabled` off) is left
    alone by the autoscaler: its replicas are whatever was registered by hand."""

    model_version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE,
                                         related_name="scaling_policy")
    enabled = models.BooleanField(default=True)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=4)
    # Ready replicas kept idle on top of what the load needs (absorb a burst while more load).
    warm_pool_size = models.PositiveIntegerField(default=0)
    # With no traffic for `scale_to_zero_after_s`, go to zero replicas (min_replicas ignored);
    # requests that arrive then wait in the queue while the first replica loads.
    scale_to_zero = models.BooleanField(default=False)
    scale_to_zero_after_s = models.FloatField(default=300.0)
    predictive = models.BooleanField(default=True)  # use the time-of-day forecast
    # Reactive targets, per ready replica.
    target_queue_depth = models.PositiveIntegerField(default=4)
    target_outstanding_tokens = models.PositiveIntegerField(default=4096)
    # What one replica sustains (requests/s) at the tier targets: sizes the fleet from a rate.
    replica_capacity_rps = models.FloatField(default=1.0)
    scale_up_cooldown_s = models.FloatField(default=15.0)
    # Scale down only to the highest recommendation of this window (no flapping).
    scale_down_cooldown_s = models.FloatField(default=120.0)
    # Forecast: the period of the profile (a day; shorter in benchmarks) and its bin width.
    forecast_period_s = models.FloatField(default=86400.0)
    forecast_bin_s = models.FloatField(default=300.0)
    # Replica size, reserved on its node at placement.
    replica_cpu_slots = models.PositiveIntegerField(default=1)
    replica_memory_mib = models.PositiveIntegerField(default=1024)
    # Load time (start -> ready) assumed until a replica of this version was measured.
    default_load_seconds = models.FloatField(default=60.0)

    class Meta:
        verbose_name_plural = "scaling policies"

    def __str__(self) -> str:
        return f"scaling of {self.model_version}"
