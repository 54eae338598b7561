"""A framework's structured output against `kvb serve`: LangChain's `with_structured_output`
(over `langchain-openai`'s ChatOpenAI, which sends `response_format: json_schema`) gives an
instance of the caller's Pydantic model, and `bind_tools` with a forced tool gives a call whose
arguments fit.

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

# Tools bound the LangChain way, the call forced by name: its args are a dict that fits.
from langchain_core.tools import tool


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"]) -> str:
    """The weather in a city."""
    return "18 degrees"


message = llm.bind_tools([get_weather], tool_choice="get_weather", seed=0).invoke("Weather in Paris?")
assert len(message.tool_calls) == 1, message
call = message.tool_calls[0]
# The schema LangChain sends says nothing of other keys; kvb admits none (as vLLM), so a small
# model cannot wander in invented keys until its tokens run out.
assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}, call
assert call["args"]["unit"] in ("celsius", "fahrenheit"), call

print(f"langchain client: ok ({len(people)} people, e.g. {people[0].model_dump_json()})")
