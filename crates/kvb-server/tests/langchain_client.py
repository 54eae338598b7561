"""A framework's structured output against `kvb serve`: LangChain's `with_structured_output`
(over `langchain-openai`'s ChatOpenAI, which sends `response_format: json_schema`) gives an
instance of the caller's Pydantic model, and its tool-free JSON mode parses.

usage: langchain_client.py BASE_URL MODEL
"""

import sys
from typing import Literal

from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

base_url, model = sys.argv[1], sys.argv[2]


class Person(BaseModel):
    """Someone the model describes."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)
    tags: list[Literal["a", "b", "c"]] = Field(max_length=3)
    ok: bool


llm = ChatOpenAI(base_url=base_url + "/v1", api_key="unused", model=model, max_retries=0,
                 temperature=0.7, max_tokens=150)
people = []
for seed in range(4):
    structured = llm.bind(seed=seed).with_structured_output(Person, method="json_schema")
    person = structured.invoke("Describe someone.")
    assert isinstance(person, Person), person
    people.append(person)

# include_raw gives the message too: its content is the JSON the model wrote.
raw = llm.with_structured_output(Person, method="json_schema", include_raw=True).invoke("Again.")
assert raw["parsing_error"] is None, raw
assert isinstance(raw["parsed"], Person)
assert Person.model_validate_json(raw["raw"].content) == raw["parsed"]

print(f"langchain client: ok ({len(people)} people, e.g. {people[0].model_dump_json()})")
