"""The warm questions of this folder's README: bench/corpus/long_document.md read once (cold),
then 30 questions on it, one new token each. Run from the repository root:
python3 bench/results/2026-12-06-attn-group-rows/make_requests.py > /tmp/warm30.jsonl"""
import json

doc = open("bench/corpus/long_document.md").read()
questions = [
    "What is the main topic?", "Who wrote this document?", "Summarize the second section.",
    "What does the word chunk mean here?", "Name three key ideas.", "What is the conclusion?",
    "Is there a table in it?", "What problem does it solve?", "How long is the document?",
    "Which section is longest?",
]
ask = lambda q: doc + "\n\nQuestion: " + q + "\nAnswer:"
print(json.dumps({"id": "cold", "prompt": ask("What is this about?"), "max_new_tokens": 1}))
for i in range(30):
    q = f"{questions[i % 10]} ({i})"
    print(json.dumps({"id": i, "prompt": ask(q), "max_new_tokens": 1}))
