"""Agents written against the OpenAI chat API, trained unchanged: during a rollout the worker serves
`/v1/chat/completions` on a local port over its own engine, each episode's agent gets an `openai` client
pointed at it, and every call's exact prompt ids, sampled ids and logprobs are recorded.

One episode's calls are stitched into a trajectory. A call whose messages are the previous call's messages,
the assistant message it returned, then new `tool` messages (or one new `user` message), continues the same
token sequence: its prompt is the previous ids, the sampled ids, then the template's ids of the new messages
(rollout/conversation.py), exactly what the native tool path builds. Any other call (the agent edited,
dropped or reordered earlier messages, changed the tools, or added other roles) is rendered from its
messages by the chat template and starts a new segment: the ids the model ran are still the ids trained on,
but the earlier segment is not its prefix (docs/tools.md).

The sampling settings are the run's (rollout.temperature, max_tokens_per_turn), whatever a request says: the
trainer scores at the temperature vLLM sampled at.
"""
from __future__ import annotations

import json
import queue
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from envs.base import Observation
from rollout import tool_calls
from rollout.trajectory import Segment


@dataclass
class _Thread:
    """One episode's calls so far: the open segment and what its last call sent and returned."""
    segments: list[Segment] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    messages: list | None = None  # the last call's messages plus the assistant message it returned
    tools: list | None = None
    generated: list[int] = field(default_factory=list)
    calls: int = 0
    replies: list[str] = field(default_factory=list)  # each call's reply text, as the episode's actions
    tool_ids: int = 0  # the episode's tool calls so far, numbering their ids

    def close_segment(self) -> None:
        if self.ids:
            self.segments.append(Segment(self.ids, self.mask, self.lps, []))
        self.ids, self.mask, self.lps = [], [], []


class Endpoint:
    """The HTTP endpoint of one rollout; `serve(slot)` is an episode's base_url. Requests wait in a queue that
    the rollout's own thread drains into batched engine calls (vLLM's offline engine is not thread-safe)."""

    def __init__(self, chat_for, limit: int):
        self.chat_for, self.limit = chat_for, limit
        self.pending: queue.Queue = queue.Queue()
        self.closed = False
        self.threads: dict[int, _Thread] = {}
        handler = type("Handler", (_Handler,), {"endpoint": self})
        self.httpd = _Server(("127.0.0.1", 0), handler)
        threading.Thread(target=self.httpd.serve_forever, name="openai-endpoint", daemon=True).start()

    def base_url(self, slot: int) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{slot}/v1"

    def close(self) -> None:
        self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def prompt(self, slot: int, body: dict) -> tuple[list[int], object]:
        """The ids of this call's prompt (continuing the episode's segment where the messages allow)."""
        messages, tools = body["messages"], body.get("tools") or None
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        chat = self.chat_for(system, tools)
        th = self.threads.setdefault(slot, _Thread())
        n = len(th.messages or [])
        new = messages[n:]
        continues = (th.messages is not None and tools == th.tools and len(messages) > n
                     and [_key(m) for m in messages[:n]] == [_key(m) for m in th.messages])
        if continues and all(m["role"] == "tool" for m in new):
            last_calls = th.messages[-1].get("tool_calls") or []
            calls = [{"id": c["id"], "type": "function",
                      "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                     for c in last_calls]
            results = [{"role": "tool", "tool_call_id": m.get("tool_call_id", ""), "name": m.get("name", ""),
                        "content": _text(m["content"])} for m in new]
            suffix = chat.tool_result_ids(calls, results, th.generated)
        elif continues and len(new) == 1 and new[0]["role"] == "user":
            suffix = chat.observation_ids(Observation(_text(new[0]["content"])), th.generated)
        else:
            th.close_segment()
            suffix = chat._ids(chat._render([_for_template(m) for m in messages], True))
        return th.ids + suffix, (th, chat, messages, tools, suffix)

    def record(self, state, gen) -> dict:
        """Append a call's sampled ids to its episode and build the API's response message."""
        th, chat, messages, tools, suffix = state
        th.ids += suffix
        th.mask += [0] * len(suffix)
        th.lps += [0.0] * len(suffix)
        th.ids += gen.token_ids
        th.mask += [1] * len(gen.token_ids)
        th.lps += gen.logprobs
        th.generated, th.calls, th.tools = list(gen.token_ids), th.calls + 1, tools
        text = chat.action_text(gen.token_ids)
        th.replies.append(text)
        message: dict = {"role": "assistant", "content": text}
        finish = "length" if gen.finish_reason == "length" else "stop"
        if tools and chat.tool_format:
            content, calls = tool_calls.parse(chat.tool_format, text, th.tool_ids)
            if calls and not any(c.error for c in calls):
                message = {"role": "assistant", "content": content or None, "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]}
                finish = "tool_calls"
                th.tool_ids += len(calls)
        th.messages = list(messages) + [message]
        return {"id": f"chatcmpl-{id(gen)}", "object": "chat.completion", "created": 0, "model": "grpo",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {"prompt_tokens": gen.expanded_prompt_len, "completion_tokens": len(gen.token_ids),
                          "total_tokens": gen.expanded_prompt_len + len(gen.token_ids)}}


def _key(m: dict):
    calls = tuple((c["function"]["name"], json.dumps(json.loads(c["function"]["arguments"]), sort_keys=True))
                  for c in (m.get("tool_calls") or []))
    return m.get("role"), _text(m.get("content")), calls


def _error(message: str, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def _for_template(m: dict) -> dict:
    """An API message as chat templates read it: text content, tool-call arguments as a dict."""
    out = {k: v for k, v in m.items() if v is not None}
    out["content"] = _text(m.get("content"))
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c.get("id", ""), "type": "function", "function": {
            "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m["tool_calls"]]
    return out


def _text(content) -> str:
    """A message's content as text (the API allows a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


class _Server(ThreadingHTTPServer):
    # Every episode's agent connects at once; socketserver's default backlog of 5 resets the connections past it.
    request_queue_size = 1024
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    endpoint: Endpoint

    def log_message(self, *args) -> None:  # the rollout's own stats say what happened; no line per request
        pass

    def _send(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.endswith("/v1/models"):
            return self._send(200, {"object": "list", "data": [{"id": "grpo", "object": "model"}]})
        self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        parts = self.path.strip("/").split("/")
        if len(parts) != 4 or parts[1:] != ["v1", "chat", "completions"] or not parts[0].isdigit():
            return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if body.get("stream") or body.get("n", 1) != 1:
            return self._send(400, _error("stream and n > 1 are not served"))
        if self.endpoint.closed:
            return self._send(503, _error("the rollout stopped", "unavailable"))
        done: Future = Future()
        self.endpoint.pending.put((int(parts[0]), body, done))
        code, obj = done.result()
        self._send(code, obj)


def run_agents(worker, episodes, config, sampling, use_adapter: bool) -> tuple[int, float, int]:
    """Run the agent of every episode (envs.AgentEnv) on its own thread against the endpoint, serving their
    calls in batched engine calls; fills each episode's segments, rewards and stop reason. Returns (engine
    calls, engine seconds, prompt tokens)."""
    import openai

    from rollout.engine import Request

    def chat_for(system, tools):
        return worker._chat(system).with_tools(tools) if tools else worker._chat(system)

    endpoint = Endpoint(chat_for, worker.engine.cfg.max_model_len)
    outcomes: dict[int, object] = {}

    def run(e):
        client = openai.OpenAI(base_url=endpoint.base_url(e.slot), api_key="grpo", max_retries=0, timeout=600)
        try:
            outcomes[e.slot] = e.env.agent(client, e.env.task)
        except Exception:  # the agent's failure ends the rollout with its traceback, below
            outcomes[e.slot] = AgentFailure(traceback.format_exc())

    pool = ThreadPoolExecutor(len(episodes), thread_name_prefix="agent")
    futures = [pool.submit(run, e) for e in episodes]
    calls, engine_s, prompt_tokens, finished = 0, 0.0, 0, False
    try:
        while not all(f.done() for f in futures) or not endpoint.pending.empty():
            try:
                batch = [endpoint.pending.get(timeout=0.01)]
            except queue.Empty:
                continue
            time.sleep(0.005)  # let the other agents' calls of this turn arrive, so they share an engine call
            while not endpoint.pending.empty():
                batch.append(endpoint.pending.get_nowait())
            ready, requests = [], []
            for slot, body, done in batch:
                try:
                    ids, state = endpoint.prompt(slot, body)
                except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
                    done.set_result((400, _error(f"bad request: {err!r}")))
                    continue
                if len(ids) + config.max_tokens_per_turn > endpoint.limit:
                    n = config.max_tokens_per_turn
                    done.set_result((400, _error(f"the context holds {len(ids)} tokens; with {n} to generate it "
                                                 f"passes max_model_len={endpoint.limit}", "context_length_exceeded")))
                    continue
                ready.append((ids, state, done))
                requests.append(Request(ids, []))
            if not requests:
                continue
            t = time.perf_counter()
            gens = worker.engine.generate(requests, sampling, use_adapter)
            engine_s += time.perf_counter() - t
            calls += 1
            for (_, state, done), gen in zip(ready, gens):
                prompt_tokens += gen.expanded_prompt_len
                done.set_result((200, endpoint.record(state, gen)))
        finished = True
    finally:
        endpoint.close()
        if not finished:
            # The engine failed: the agents waiting on an answer get an error instead of waiting forever.
            while not endpoint.pending.empty():
                endpoint.pending.get_nowait()[2].set_result((503, _error("the rollout stopped", "unavailable")))
        pool.shutdown(wait=finished, cancel_futures=not finished)
    for e in episodes:
        out = outcomes.get(e.slot)
        if isinstance(out, AgentFailure):
            raise RuntimeError(f"the agent of env {e.task.env!r} seed {e.task.seed} raised:\n{out.traceback}")
        th = endpoint.threads.get(e.slot, _Thread())
        th.close_segment()
        reward, success = _reward(out)
        n = max(th.calls, 1)
        e.segments = th.segments
        e.turn_rewards = [0.0] * (n - 1) + [reward]
        e.turn_states = [None] * n
        e.actions = th.replies or [""]
        e.success = success
        e.stop_reason = "done"
    return calls, engine_s, prompt_tokens


@dataclass(frozen=True)
class AgentFailure:
    traceback: str


def _reward(out) -> tuple[float, bool]:
    """An agent returns its reward, or a dict with "reward" and optionally "success" (default: reward >= 1)."""
    if isinstance(out, dict):
        reward = float(out["reward"])
        return reward, bool(out.get("success", reward >= 1.0))
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return float(out), float(out) >= 1.0
    raise TypeError(f"an agent must return its reward (a number) or {{'reward': ..., 'success': ...}}, got {out!r}")

