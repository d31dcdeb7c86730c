"""``rlforge export --push-to-hub``: the model card, and the upload to a local stand-in for the Hub's HTTP API.

The stand-in answers the calls huggingface_hub makes for ``create_repo`` and ``upload_folder``: ``POST
/api/repos/create``, ``POST /api/models/{repo}/preupload/{revision}`` (every file "regular": its bytes go base64 in the
commit; the real Hub sends weights through LFS/Xet storage, which a stand-in does not implement) and ``POST
/api/models/{repo}/commit/{revision}`` (NDJSON), plus ``/api/validate-yaml`` where hf_xet is not installed.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rlforge.cli import main

pytestmark = pytest.mark.usefixtures("no_autoload")
TOKEN = "hf_test_token"


class StandInHub(BaseHTTPRequestHandler):
    """Repos in ``server.repos`` ({repo_id: {"visibility": ..., "files": {path: bytes}}}); a token is required; a repo
    named ``broken`` answers 500."""

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        server.calls.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._reply(401, {"error": "Invalid credentials in Authorization header"})
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts == ["api", "repos", "create"]:
            payload = json.loads(body)
            repo_id = f"{payload['organization']}/{payload['name']}"
            if payload["name"] == "broken":
                return self._reply(500, {"error": "Internal Error - We're working hard to fix this as soon as possible!"})
            if repo_id in server.repos:
                return self._reply(409, {"error": "You already created this model repo", "url": self._url(repo_id)})
            server.repos[repo_id] = {"visibility": payload.get("visibility", "public"), "files": {}}
            return self._reply(200, {"url": self._url(repo_id)})
        if parts[:2] == ["api", "validate-yaml"]:
            return self._reply(200, {"errors": [], "warnings": []})
        if parts[:2] == ["api", "models"] and len(parts) == 6 and parts[4] in ("preupload", "commit"):
            repo_id = f"{parts[2]}/{parts[3]}"
            if repo_id not in server.repos:
                return self._reply(404, {"error": "Repository not found"})
            if parts[4] == "preupload":
                files = json.loads(body)["files"]
                return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                   for f in files]})
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
            for line in lines:
                assert line["key"] in ("header", "file"), line["key"]  # regular files only
                if line["key"] == "file":
                    server.repos[repo_id]["files"][line["value"]["path"]] = base64.b64decode(line["value"]["content"])
            server.repos[repo_id]["summary"] = lines[0]["value"]["summary"]
            oid = "0123456789abcdef0123456789abcdef01234567"
            return self._reply(200, {"commitUrl": f"{self._url(repo_id)}/commit/{oid}", "commitOid": oid})
        return self._reply(404, {"error": f"the stand-in has no {self.path}"})

    def _url(self, repo_id: str) -> str:
        return f"http://{self.server.server_address[0]}:{self.server.server_address[1]}/{repo_id}"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The stand-in on a free local port, as the Hub (HF_ENDPOINT) with HF_TOKEN set."""
    from huggingface_hub import constants

    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInHub)
    server.repos, server.calls = {}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # read once, when huggingface_hub was imported
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet"))  # hf_xet's session writes its logs there
    yield server
    server.shutdown()
    server.server_close()


def _card(text: str) -> tuple[dict, str]:
    _, header, body = text.split("---\n", 2)
    return yaml.safe_load(header), body


def test_an_export_has_a_model_card_with_how_it_was_trained(fitted_run, tmp_path, capsys):
    trainer, _ = fitted_run
    out = tmp_path / "model"
    assert main(["export", str(trainer.run_dir), str(out)]) == 0
    header, body = _card((out / "README.md").read_text())
    assert header == {"library_name": "transformers", "tags": ["rlforge", "grpo"]}  # builtin:: no base_model id
    assert "`builtin:tiny-arith`" in body and "| algorithm | `grpo`" in body and "| steps | 2 |" in body
    assert "`data.name=arith`; 512 training examples" in body
    import rlforge

    assert f"| rlforge | {rlforge.__version__} |" in body
    # the run validated before training and after each step (trainer.val_every=1): figures from its mlflow store
    validation = body.split("## Validation")[1].split("## Use")[0]
    assert "| step | `val/accuracy` | `val/reward` |" in validation
    assert "| 0 (before training) |" in validation and "| 1 |" in validation and "| 2 |" in validation
    assert 'AutoModelForCausalLM.from_pretrained(\'model\')' in body


def test_push_to_hub_creates_the_repo_and_uploads_the_folder_and_card(fitted_run, tmp_path, hub, capsys):
    trainer, _ = fitted_run
    out = tmp_path / "pushed"
    assert main(["export", str(trainer.run_dir), str(out), "--push-to-hub", "me/tiny-grpo", "--private"]) == 0
    printed = capsys.readouterr().out
    assert "pushed to http://127.0.0.1:" in printed and "/me/tiny-grpo/commit/" in printed
    repo = hub.repos["me/tiny-grpo"]
    assert repo["visibility"] == "private" and repo["summary"] == "rlforge export (pushed)"
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert repo["files"] == local and "model.safetensors" in local  # every file, byte for byte
    header, body = _card(repo["files"]["README.md"].decode())
    assert header["library_name"] == "transformers" and "rlforge" in header["tags"]
    assert "# me/tiny-grpo" in body and "from_pretrained('me/tiny-grpo')" in body
    # an existing repo: pushed again (409 from create is fine), its visibility kept
    again = tmp_path / "again"
    assert main(["export", str(trainer.run_dir), str(again), "--push-to-hub", "me/tiny-grpo"]) == 0
    assert hub.repos["me/tiny-grpo"]["visibility"] == "private"


def test_push_mistakes_are_one_clear_line(fitted_run, tmp_path, hub, capsys, monkeypatch):
    trainer, _ = fitted_run

    def error(*argv: str) -> str:
        assert main(["export", str(trainer.run_dir), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("rlforge: error: ")
        return err

    err = error(str(tmp_path / "a"), "--push-to-hub", "me/bad name")
    assert "'me/bad name' is not a Hub repo id" in err and not (tmp_path / "a").exists()  # checked first
    assert "give --push-to-hub too" in error(str(tmp_path / "b"), "--private")
    err = error(str(tmp_path / "c"), "--push-to-hub", "me/broken")
    assert "Pushing to the Hub repo me/broken at http://127.0.0.1:" in err and "HTTP 500" in err
    assert f"The export is complete in {tmp_path / 'c'}" in err and (tmp_path / "c" / "README.md").is_file()
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    err = error(str(tmp_path / "d"), "--push-to-hub", "me/x")
    assert "HTTP 401" in err and "the token is not valid" in err
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    calls = len(hub.calls)
    err = error(str(tmp_path / "e"), "--push-to-hub", "me/x")
    assert "needs a Hugging Face token with write access: set HF_TOKEN" in err and not (tmp_path / "e").exists()
    assert len(hub.calls) == calls  # refused before any export or request


def test_the_card_of_a_lora_adapter_from_a_hub_model_on_hub_data(tmp_path):
    """An adapter's card: peft's library, the Hub base model in the header, the figures of metrics.jsonl, local paths
    by name only."""
    from rlforge.tools.model_card import model_card

    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step_000003"
    (checkpoint / "actor").mkdir(parents=True)
    config = {"algorithm": {"name": "dpo"}, "model": {"lora": {"rank": 8}},
              "data": {"name": "hf", "train_files": [], "hf": {"path": "openai/gsm8k", "config_name": "main",
                                                               "train_split": "train"}}}
    (checkpoint / "meta.json").write_text(json.dumps({"step": 3, "config": config, "data": {"prompts": 7473}}))
    records = [{"step": 0, "val/accuracy": 0.1}, {"step": 2, "critic/score/mean": 0.3},
               {"step": 2, "val/accuracy": 0.2, "val/reward": 0.4}, {"step": 4, "val/accuracy": 0.9}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    header, body = _card(model_card(tmp_path / "out", checkpoint, adapter=True, base_model="Qwen/Qwen2.5-0.5B-Instruct",
                                    repo_id=None))
    assert header == {"base_model": "Qwen/Qwen2.5-0.5B-Instruct", "library_name": "peft",
                      "tags": ["rlforge", "dpo", "lora"]}
    assert "`openai/gsm8k` (main), split `train`; 7473 training examples" in body
    assert "| 0 (before training) | 0.1000 |  |" in body and "| 2 | 0.2000 | 0.4000 |" in body
    assert "| 4 |" not in body  # after the checkpoint's step
    assert "AutoPeftModelForCausalLM.from_pretrained('out')" in body
    local = model_card(tmp_path / "out", checkpoint, adapter=False, base_model=str(tmp_path), repo_id=None)
    assert f"a local folder `{tmp_path.name}`" in local and str(tmp_path) not in local and "base_model" not in local
