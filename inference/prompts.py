"""The prompt of a request as a serving version sees it: rendered with the version's chat
template, encoded with its own tokenizer, and the max_tokens that fits its context window."""
from __future__ import annotations

import logging

from asgiref.sync import sync_to_async

from inference.errors import InvalidRequest, ServiceUnavailable
from inference.prompt_segments import SegmentEncoder
from inference.request import Prompt
from inference.schemas import GenerationRequest
from inference.tokenization import TokenizerCache
from models_registry.selectors import ServingVersion

logger = logging.getLogger(__name__)

# max_tokens when neither the body nor the endpoint kind sets one: the rest of the context
# window, up to this.
DEFAULT_MAX_TOKENS = 256
# Prompts longer than this are tokenized off the event loop (a thread of their own); shorter
# ones inline: a thread hop costs more than encoding them.
INLINE_TOKENIZE_CHARS = 4096
# With a segment cache, prompts up to this long are rendered on the event loop, and encoded
# there too when what the cache lacks of them is at most INLINE_TOKENIZE_CHARS.
INLINE_RENDER_CHARS = 65536


class PromptEncoder:
    """`segment_cache_chars`: each tokenizer's cache of encoded prompt pieces
    (inference/prompt_segments.py), in characters; 0: none (every prompt encoded whole)."""

    def __init__(self, tokenizers: TokenizerCache, segment_cache_chars: int = 0):
        self._tokenizers = tokenizers
        self._segment_cache_chars = segment_cache_chars
        self._segments: dict[int, SegmentEncoder | None] = {}  # id(tokenizer) -> its encoder
        self._held: list = []  # the tokenizers those ids name (kept alive: ids stay unique)

    def _segment_encoder(self, tokenizer) -> SegmentEncoder | None:
        key = id(tokenizer)
        try:
            return self._segments[key]
        except KeyError:
            pass
        encoder = SegmentEncoder.for_tokenizer(tokenizer, self._segment_cache_chars)
        self._held.append(tokenizer)
        self._segments[key] = encoder
        return encoder

    async def encode(self, target: ServingVersion, request: GenerationRequest,
                     tenant_id: int | None = None) -> Prompt:
        """503 model_unavailable when the version's tokenizer cannot load; 400 when its chat
        template refuses the messages. A chat prompt is rendered once and encoded piece by piece
        through the tokenizer's segment cache, the tenant's own (`tenant_id`), where the
        tokenizer allows it: the same ids as encoding it whole."""
        try:
            tokenizer = await self._tokenizers.aget(target.tokenizer, target.weights_uri)
        except (OSError, ImportError, ValueError, KeyError) as exc:
            logger.exception("cannot load the tokenizer of %s", target.model_name)
            raise ServiceUnavailable(
                f"The model '{target.model_name}' is not available right now.",
                code="model_unavailable", headers={"Retry-After": "30"}) from exc

        def render() -> str:
            try:
                return tokenizer.apply_chat_template(list(request.messages),
                                                     add_generation_prompt=True)
            except ValueError as exc:  # the model's template rejects these messages
                raise InvalidRequest(f"messages: {exc}", param="messages") from exc

        def render_and_encode() -> Prompt:
            if request.messages is None:
                return Prompt(request.prompt, tuple(tokenizer.encode(request.prompt)))
            text = render()
            try:
                return Prompt(text, tuple(tokenizer.encode_chat(list(request.messages),
                                                                add_generation_prompt=True)))
            except ValueError as exc:
                raise InvalidRequest(f"messages: {exc}", param="messages") from exc

        size = (sum(len(m["content"]) for m in request.messages) if request.messages
                else len(request.prompt))
        segments = (self._segment_encoder(tokenizer)
                    if request.messages is not None and self._segment_cache_chars else None)
        if segments is not None:
            def render_and_encode_pieces() -> Prompt:
                text = render()
                return Prompt(text, segments.encode(text, tenant_id))

            if size <= INLINE_TOKENIZE_CHARS:
                return render_and_encode_pieces()
            if size <= INLINE_RENDER_CHARS:  # a long prompt, but mostly cached: no thread hop
                text = render()
                if segments.uncached_chars(text, tenant_id) <= INLINE_TOKENIZE_CHARS:
                    return Prompt(text, segments.encode(text, tenant_id))
                return Prompt(text, await sync_to_async(
                    segments.encode, thread_sensitive=False)(text, tenant_id))
            return await sync_to_async(render_and_encode_pieces, thread_sensitive=False)()
        if size <= INLINE_TOKENIZE_CHARS:
            return render_and_encode()
        return await sync_to_async(render_and_encode, thread_sensitive=False)()


def max_tokens_for(request: GenerationRequest, num_prompt_tokens: int,
                   context_length: int) -> int:
    """What the request may generate: as asked (400 when the prompt plus that exceeds the
    context window), else the rest of the window up to DEFAULT_MAX_TOKENS."""
    room = context_length - num_prompt_tokens
    asked = request.sampling.max_tokens
    if asked is None:
        if room < 1:
            raise InvalidRequest(
                f"The prompt has {num_prompt_tokens} tokens; the context window is "
                f"{context_length}.", code="context_length_exceeded", param="messages")
        return min(DEFAULT_MAX_TOKENS, room)
    if num_prompt_tokens + asked > context_length:
        raise InvalidRequest(
            f"The prompt ({num_prompt_tokens} tokens) plus max_tokens ({asked}) exceeds the "
            f"model's context window of {context_length} tokens.",
            code="context_length_exceeded", param="max_tokens")
    return asked
