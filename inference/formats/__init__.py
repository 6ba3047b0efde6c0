from inference.formats.native import NativeFormat
from inference.formats.openai import ChatFormat, CompletionsFormat

FORMATS = {
    "generate": NativeFormat,
    "chat": ChatFormat,
    "completions": CompletionsFormat,
}
