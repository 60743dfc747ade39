"""The ``generateContent`` request as :mod:`adapters.gemini.request` builds it and the adapter
sends it: types only (plain dicts at runtime)."""

from __future__ import annotations

from typing import Any, Literal, Required, TypedDict

__all__ = [
    "GeminiBlob",
    "GeminiContent",
    "GeminiFileData",
    "GeminiFunctionCall",
    "GeminiFunctionCallingConfig",
    "GeminiFunctionDeclaration",
    "GeminiFunctionResponse",
    "GeminiGenerationConfig",
    "GeminiPart",
    "GeminiRequest",
    "GeminiSamplingKey",
    "GeminiSystemInstruction",
    "GeminiThinkingConfig",
    "GeminiTool",
    "GeminiToolConfig",
]

GeminiSamplingKey = Literal["temperature", "topP", "presencePenalty", "frequencyPenalty"]


class GeminiBlob(TypedDict):
    mimeType: str
    data: str


class GeminiFileData(TypedDict):
    mimeType: str
    fileUri: str


class GeminiFunctionCall(TypedDict):
    name: str
    args: dict[str, Any]


class GeminiFunctionResponse(TypedDict):
    name: str
    response: dict[str, Any]


class GeminiPart(TypedDict, total=False):
    """One part: one of its data fields (the API's oneof); a model part may carry the
    ``thoughtSignature`` of the reasoning before it."""

    text: str
    inlineData: GeminiBlob
    fileData: GeminiFileData
    functionCall: GeminiFunctionCall
    functionResponse: GeminiFunctionResponse
    thoughtSignature: str


class GeminiContent(TypedDict):
    """One turn."""

    role: Literal["user", "model"]
    parts: list[GeminiPart]


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
    stopSequences: list[str]
    seed: int


class GeminiRequest(TypedDict, total=False):
    """The ``:generateContent`` / ``:streamGenerateContent`` body; ``contents`` is always set."""

    contents: Required[list[GeminiContent]]
    systemInstruction: GeminiSystemInstruction
    tools: list[GeminiTool]
    toolConfig: GeminiToolConfig
    generationConfig: GeminiGenerationConfig
