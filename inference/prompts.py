"""The prompt of a request as a serving version sees it: rendered with the version's chat
template, encoded with its own tokenizer, and the max_tokens that fits its context window."""
from __future__ import annotations

import logging

from asgiref.sync import sync_to_async

from inference.errors import InvalidRequest, ServiceUnavailable
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


class PromptEncoder:
    def __init__(self, tokenizers: TokenizerCache):
        self._tokenizers = tokenizers

    async def encode(self, target: ServingVersion, request: GenerationRequest) -> Prompt:
        """503 model_unavailable when the version's tokenizer cannot load; 400 when its chat
        template refuses the messages."""
        try:
            tokenizer = await self._tokenizers.aget(target.tokenizer, target.weights_uri)
        except (OSError, ImportError, ValueError, KeyError) as exc:
            logger.exception("cannot load the tokenizer of %s", target.model_name)
            raise ServiceUnavailable(
                f"The model '{target.model_name}' is not available right now.",
                code="model_unavailable", headers={"Retry-After": "30"}) from exc

        def render_and_encode() -> Prompt:
            if request.messages is None:
                return Prompt(request.prompt, tuple(tokenizer.encode(request.prompt)))
            messages = list(request.messages)
            try:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
                return Prompt(text, tuple(tokenizer.encode_chat(messages,
                                                                add_generation_prompt=True)))
            except ValueError as exc:  # the model's template rejects these messages
                raise InvalidRequest(f"messages: {exc}", param="messages") from exc

        size = (sum(len(m["content"]) for m in request.messages) if request.messages
                else len(request.prompt))
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
