"""The recall-keywords prompt: a user's question → search keywords."""

from __future__ import annotations

from pydantic import BaseModel, Field

from worker.prompts.template import PromptTemplate, system_text


class KeywordsAnswer(BaseModel):
    keywords: list[str] = Field(
        max_length=64,
        description="Words or short phrases to search the user's memories for, most important first.",
    )


ResponseModel = KeywordsAnswer

DEFAULT = PromptTemplate(
    version="keywords@v1",
    text="""An AI assistant is about to answer the user's message below and will search its memory of the
user first. List the keywords to search for: names, places, things, topics and their likely synonyms, in the
language of the message (add English or Chinese equivalents where the memory may use the other language).
Leave out filler words.""",
)


def build_messages(template: PromptTemplate, query: str, *, schema_in_prompt: bool = False) -> list[dict[str, str]]:
    system = system_text(template, ResponseModel, schema_in_prompt=schema_in_prompt)
    return [{"role": "system", "content": system}, {"role": "user", "content": query}]
