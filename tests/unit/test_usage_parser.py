from __future__ import annotations

from ppc_extproc.server.usage import Usage, UsageParser


def test_json_usage_with_cached_tokens() -> None:
    parser = UsageParser(streaming=False)
    body = b'{"usage":{"prompt_tokens":64,"completion_tokens":4,"total_tokens":68,"prompt_tokens_details":{"cached_tokens":48}}}'
    parser.feed(body[:10])
    parser.feed(body[10:])
    assert parser.finish() == Usage(64, 4, 68, 48)


def test_sse_last_usage_wins_across_split_lines() -> None:
    parser = UsageParser(streaming=True)
    stream = b'data: {"usage":{"prompt_tokens":1}}\n\ndata: {"choices":[]}\n\ndata: {"usage":{"prompt_tokens":7,"completion_tokens":10}}\n\ndata: [DONE]\n\n'
    for i in range(0, len(stream), 5):
        parser.feed(stream[i : i + 5])
    assert parser.finish() == Usage(7, 10, None, None)


def test_responses_api_usage() -> None:
    parser = UsageParser(streaming=True)
    parser.feed(b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}}\n')
    assert parser.finish() == Usage(5, 2, 7, None)


def test_not_json_gives_no_usage() -> None:
    parser = UsageParser(streaming=False)
    parser.feed(b"no healthy upstream")
    assert parser.finish() is None


def test_buffer_is_bounded() -> None:
    parser = UsageParser(streaming=False)
    parser.feed(b"x" * (9 * 1024 * 1024))
    parser.feed(b'{"usage":{"prompt_tokens":1}}')
    assert parser.finish() is None
