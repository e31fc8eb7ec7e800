"""Online serving on Ray Serve (issue 5): the OpenAI API over HTTP, one BlockServe engine per replica.

The routes answer as ``engine.generate`` does, stream one chunk per committed block, keep to the OpenAI
types; sixteen concurrent requests are batched online; an overloaded app answers 429, a keyed one 401;
bad requests get a 400 naming the field; a disconnected stream is aborted; /metrics reports the engine.

One Serve instance on the session's Ray cluster hosts two apps (``tests/serve_helpers.py``): ``main``
(16 rows, route ``/``) and ``small`` (2 rows, 2 waiting, route ``/small``, for backpressure, behind an
API key). Every answer is compared with ``engine.generate`` run here on the same frozen copy of the tiny
model in float32 (the trainer re-exports ``assets/tiny`` while tests run, so nothing reads it twice).
"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from engine import SamplingParams
from tests.serve_helpers import MODEL, SMALL_AUTH, SMALL_KEY, TIMEOUT_S, chat, metric, sse_events, wait_until

pytestmark = pytest.mark.timeout(600)


# -- the API ---------------------------------------------------------------------------------------
def test_models_route_lists_the_served_model_and_health_is_ok(server, client):
    assert [model.id for model in client.models.list()] == [MODEL]
    health = httpx.get(f"{server}/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_completion_and_chat_equal_engine_generate(client, expect):
    prompt, messages = "count from 3 to 12", chat("count from 3 to 12")
    completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=64)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64)
    expected_text, expected_chat = expect(prompt, 64), expect(messages, 64)
    for choice_text, response, expected in ((completion.choices[0].text, completion, expected_text),
                                            (answer.choices[0].message.content, answer, expected_chat)):
        assert choice_text == expected.text
        assert response.choices[0].finish_reason == {"eos": "stop", "length": "length"}[
            expected.finish_reason]
        assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
        assert response.usage.completion_tokens == len(expected.token_ids)
        assert response.model == MODEL


def test_stream_sends_one_chunk_per_committed_block_then_done(server, client, expect):
    body = {"model": MODEL, "prompt": "count from 5 to 40", "max_tokens": 96, "stream": True,
            "ignore_eos": True}  # the model's own length, 64 tokens: 8 blocks of 8, then the cap
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=TIMEOUT_S) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    expected = expect("count from 5 to 40", 96, stop_at_eos=False)
    assert len(chunks) == expected.num_blocks == 8
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None] * 7 + ["length"]
    assert chunks[-1]["blockserve"]["num_blocks"] == 8
    assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == expected.text

    stream = client.chat.completions.create(model=MODEL, messages=chat("count from 7 to 30"),
                                            max_tokens=64, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    expected = expect(chat("count from 7 to 30"), 64)
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert deltas[0].role == "assistant"
    assert "".join(delta.content or "" for delta in deltas) == expected.text
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] is not None
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


def test_stop_string_cuts_the_text_and_finishes_with_stop(client, expect):
    expected = expect(chat("count from 3 to 12"), 64)
    stop = " "
    if stop not in expected.text:
        pytest.skip(f"this export's answer has no space to stop at: {expected.text!r}")
    answer = client.chat.completions.create(model=MODEL, messages=chat("count from 3 to 12"),
                                            max_tokens=64, stop=[stop])
    assert answer.choices[0].message.content == expected.text[:expected.text.index(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_max_tokens_caps_the_text_and_the_usage_streamed_or_not(server, client, expect):
    expected = expect(chat("count from 1 to 30"), 5)
    assert len(expected.token_ids) == 5  # the engine computed a whole block of 32 and kept 5
    answer = client.chat.completions.create(model=MODEL, messages=chat("count from 1 to 30"), max_tokens=5)
    assert answer.choices[0].message.content == expected.text
    assert (answer.usage.completion_tokens, answer.choices[0].finish_reason) == (5, "length")
    chunks = list(client.chat.completions.create(model=MODEL, messages=chat("count from 1 to 30"), max_tokens=5,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == 5


def test_tokens_after_a_stop_string_are_neither_returned_nor_counted(client, expect, reference):
    expected = expect(chat("count from 3 to 12"), 64)
    words = expected.text.split(" ")
    if len(words) < 4:
        pytest.skip(f"this export's answer is too short to stop inside: {expected.text!r}")
    stop = f" {words[3]}"  # the answer's fourth word, well inside its only block
    answer = client.chat.completions.create(model=MODEL, messages=chat("count from 3 to 12"), max_tokens=64,
                                            stop=[stop])
    assert answer.choices[0].message.content == " ".join(words[:3])
    assert answer.choices[0].finish_reason == "stop"
    spelled = next(count for count in range(1, len(expected.token_ids) + 1)
                   if stop in reference.lm.tokenizer.decode(expected.token_ids[:count], skip_special_tokens=True))
    assert answer.usage.completion_tokens == spelled < len(expected.token_ids)


def test_responses_are_the_openai_types_plus_the_blockserve_object(server):
    from openai.types import Completion, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    def same_after_validation(openai_type, data: dict) -> bool:  # no field lost, none coerced
        return openai_type.model_validate(data).model_dump(mode="json") == data

    body = {"model": MODEL, "max_tokens": 32}
    for path, prompt, openai_type in (
            ("/v1/completions", {"prompt": "count from 1 to 5"}, Completion),
            ("/v1/chat/completions", {"messages": chat("count from 1 to 5")}, ChatCompletion)):
        data = httpx.post(f"{server}{path}", json={**body, **prompt}, timeout=TIMEOUT_S).json()
        assert same_after_validation(openai_type, data) and data["blockserve"]["num_blocks"] == 1
    stream = {**body, "messages": chat("count from 1 to 5"), "stream": True,
              "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=stream, timeout=TIMEOUT_S) as response:
        chunks = [json.loads(event) for event in sse_events(response)[:-1]]
    assert all(same_after_validation(ChatCompletionChunk, chunk) for chunk in chunks)
    assert "blockserve" in chunks[-2] and chunks[-1]["choices"] == [] and chunks[-1]["usage"]
    (model,) = httpx.get(f"{server}/v1/models", timeout=10).json()["data"]
    assert same_after_validation(Model, model) and model["max_model_len"] > 0


# -- online batching -------------------------------------------------------------------------------
def test_sixteen_concurrent_requests_of_different_lengths_each_equal_engine_generate(
        server, reference, heldout_rows):
    from openai import AsyncOpenAI

    by_length = sorted(heldout_rows, key=lambda row: len(row["prompt"]))
    rows = [by_length[index * (len(by_length) - 1) // 15] for index in range(16)]  # shortest to longest
    prompts = [chat(row["prompt"]) for row in rows]
    caps = [32 * (1 + index % 3) for index in range(16)]  # 1 to 3 blocks, over short and long prompts

    async def ask_all():
        client = AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)
        return await asyncio.gather(*(client.chat.completions.create(
            model=MODEL, messages=prompt, max_tokens=cap) for prompt, cap in zip(prompts, caps)))

    answers = asyncio.run(ask_all())
    expected = reference.generate(prompts, [SamplingParams(max_new_tokens=cap) for cap in caps])
    assert len({len(output.prompt_token_ids) for output in expected}) > 8, "prompt lengths should vary"
    for answer, output in zip(answers, expected):
        assert answer.choices[0].message.content == output.text
        assert answer.usage.completion_tokens == len(output.token_ids)
    admitted_at = [answer.model_extra["blockserve"]["first_scheduled_time"] for answer in answers]
    assert len(set(admitted_at)) < len(admitted_at), "no two requests were admitted at one boundary"


def test_overload_gets_429_with_retry_after_and_every_accepted_request_completes(server):
    small = f"{server}/small"
    body = {"model": MODEL, "max_tokens": 96, "ignore_eos": True}  # 3 blocks: rows stay busy

    async def burst():  # 16 at once against 2 rows + 2 waiting places
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            return await asyncio.gather(*(http.post(f"{small}/v1/chat/completions", headers=SMALL_AUTH, json={
                **body, "messages": chat(f"count from {n} to 60")}) for n in range(16)))

    responses = asyncio.run(burst())
    statuses = [response.status_code for response in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.headers["retry-after"] == "2"
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
        else:
            assert response.json()["choices"][0]["finish_reason"] == "length"
    def rejected() -> float:
        return metric(small, "ray_blockserve_requests_rejected_total")

    wait_until(lambda: rejected() >= statuses.count(429), what="Ray to export the 429s")
    assert rejected() == statuses.count(429)
    health = httpx.get(f"{small}/health", timeout=10).json()
    assert health == {**health, "status": "ok", "waiting": 0, "running": 0}


def test_with_an_api_key_v1_routes_need_the_bearer_key_and_health_stays_open(server):
    from openai import AuthenticationError, OpenAI

    small = f"{server}/small"
    body = {"model": MODEL, "max_tokens": 32, "messages": chat("count from 3 to 5")}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": SMALL_KEY}):
        response = httpx.post(f"{small}/v1/chat/completions", json=body, headers=headers, timeout=TIMEOUT_S)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{small}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{small}/health", timeout=10).status_code == 200
    with pytest.raises(AuthenticationError):
        OpenAI(base_url=f"{small}/v1", api_key="wrong", max_retries=0).models.list()
    keyed = OpenAI(base_url=f"{small}/v1", api_key=SMALL_KEY, max_retries=0, timeout=TIMEOUT_S)
    reply = keyed.chat.completions.create(model=MODEL, max_tokens=32, messages=chat("count from 3 to 5"))
    assert reply.choices[0].finish_reason in ("stop", "length")



@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"model": MODEL}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": 42}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": "8"}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"model": "gpt-4o", "prompt": "hi"}, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "n": 2}, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"model": MODEL}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
    ("/v1/chat/completions", {"model": MODEL, "messages": chat("x" * 600)}, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": chat("count from 1 to 200 " * 12),
                              "gen_length": 480}, "gen_length"),  # allowed alone, too long with this prompt
    ("/v1/completions", None, None),  # not JSON at all
])
def test_bad_requests_get_400_naming_the_field(server, path, body, param):
    if body is None:
        response = httpx.post(f"{server}{path}", content=b"{not json", timeout=10,
                              headers={"content-type": "application/json"})
    else:
        response = httpx.post(f"{server}{path}", json=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def test_chat_content_parts_are_served_over_http(client, expect):
    parts = [{"type": "text", "text": "count from 3"}, {"type": "text", "text": "to 12"}]
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}],
                                            max_tokens=64)
    assert answer.choices[0].message.content == expect(chat("count from 3\nto 12"), 64).text


def test_a_prompt_of_one_huge_word_gets_its_400_and_the_replica_stays_healthy(server):
    body = {"model": MODEL, "prompt": "z" * 12_000, "max_tokens": 32}
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert httpx.get(f"{server}/health", timeout=10).json()["status"] == "ok"


def test_disconnected_stream_is_aborted_at_the_next_block_boundary(server):
    aborted_before = metric(server, "ray_blockserve_requests_total", finish_reason="abort")
    body = {"model": MODEL, "messages": chat("count from 1 to 200"), "max_tokens": 448,
            "ignore_eos": True, "stream": True}  # 14 blocks: far longer than the test waits
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=TIMEOUT_S) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert json.loads(first[len("data: "):])["choices"][0]["finish_reason"] is None
    # leaving the block closed the connection mid-stream
    wait_until(lambda: metric(server, "ray_blockserve_requests_total", finish_reason="abort")
               >= aborted_before + 1, what="the abort to be counted")
    assert metric(server, "ray_blockserve_requests_total", finish_reason="abort") == aborted_before + 1
    wait_until(lambda: httpx.get(f"{server}/health", timeout=10).json()["running"] == 0,
               what="the aborted row to leave the batch")


def test_metrics_report_queue_rows_box_compute_ratio_throughput_and_latency(server):
    """As Ray exports them; a counter shows up after its first increment, so the 429 counter is checked
    on the app that refused requests (the overload test)."""
    text = httpx.get(f"{server}/metrics", timeout=10).text
    for name in ("blockserve_queue_depth", "blockserve_running_rows", "blockserve_bounding_box_tokens",
                 "blockserve_effective_compute_ratio", "blockserve_tokens_per_second",
                 "blockserve_request_latency_seconds_bucket", "blockserve_time_to_first_block_seconds",
                 "blockserve_engine_loop_healthy"):
        assert f"ray_{name}" in text, name
    assert metric(server, "ray_blockserve_request_latency_seconds_count") > 0
    assert metric(server, "ray_blockserve_bounding_box_tokens") > 0


def test_stop_strings_are_held_back_until_a_later_block_rules_them_out(reference):
    from actors.serving.openai.server import TextStream

    tokenizer = reference.lm.tokenizer
    text = TextStream(tokenizer, stops=["END"])

    def encode(*tokens: str) -> list[int]:  # word-level tokens; "##N" continues the word before it
        return tokenizer.convert_tokens_to_ids(list(tokens))

    assert text.add(encode("12", "3", "E")) == "12 3 "  # "E" may start "END": held back
    assert text.add(encode("x", "4", "E", "##N")) == "E x 4 "
    assert text.add(encode("##D", "5")) == "" and text.stopped and text.text == "12 3 E x 4 "
    assert text.counted_tokens == 8  # through "##D", which completes "END"; "5" comes after it
