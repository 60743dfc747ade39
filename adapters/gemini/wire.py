"""The ``generateContent`` request as :mod:`adapters.gemini.request` builds it and the adapter
sends it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "GeminiContent",
    "GeminiFunctionCallingConfig",
    "GeminiFunctionDeclaration",
    "GeminiGenerationConfig",
    "GeminiRequest",
    "GeminiSamplingKey",
    "GeminiSystemInstruction",
    "GeminiThinkingConfig",
    "GeminiTool",
    "GeminiToolConfig",
]

GeminiSamplingKey = Literal["temperature", "topP", "presencePenalty", "frequencyPenalty"]


class GeminiContent(TypedDict):
    """One turn; ``parts`` are text, inlineData, fileData, functionCall or functionResponse parts
    (the model's may carry a ``thoughtSignature``)."""

    role: Literal["user", "model"]
    parts: list[dict[str, Any]]


class GeminiTextPart(TypedDict):
    text: str


class GeminiSystemInstruction(TypedDict):
    parts: list[GeminiTextPart]


class GeminiFunctionDeclaration(TypedDict, total=False):
    name: Required[str]
    description: str
    parameters: dict[str, Any]


class GeminiTool(TypedDict):
    functionDeclarations: list[GeminiFunctionDeclaration]


class GeminiFunctionCallingConfig(TypedDict, total=False):
    mode: Required[Literal["NONE", "ANY"]]
    allowedFunctionNames: list[str]


class GeminiToolConfig(TypedDict):
    functionCallingConfig: GeminiFunctionCallingConfig


class GeminiThinkingConfig(TypedDict, total=False):
    thinkingBudget: int
    includeThoughts: bool


class GeminiGenerationConfig(TypedDict, total=False):
    maxOutputTokens: int
    temperature: float
    topP: float
    presencePenalty: float
    frequencyPenalty: float
    responseMimeType: str
    responseSchema: dict[str, Any]
    thinkingConfig: GeminiThinkingConfig
    responseLogprobs: bool
    logprobs: int


class GeminiRequest(TypedDict, total=False):
    """The ``:generateContent`` / ``:streamGenerateContent`` body; ``contents`` is always set."""

    contents: Required[list[GeminiContent]]
    systemInstruction: GeminiSystemInstruction
    tools: list[GeminiTool]
    toolConfig: GeminiToolConfig
    generationConfig: GeminiGenerationConfig
