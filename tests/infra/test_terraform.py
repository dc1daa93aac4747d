"""infra/: checkov finds no failed check (skips need a reason on the line), and the parsed
Terraform keeps the settings the rollout store relies on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

INFRA = Path(__file__).resolve().parents[2] / "infra"


def checkov_path() -> str | None:
    """$CHECKOV (set by `make test`), else checkov on PATH, else the repo's .venv-infra."""
    candidates = [os.environ.get("CHECKOV"), shutil.which("checkov"), str(INFRA.parent / ".venv-infra/bin/checkov")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.mark.slow
def test_checkov_finds_no_failed_check():
    checkov = checkov_path()
    if checkov is None:
        pytest.skip("checkov not found: set CHECKOV=<path> or run `make test` (it creates .venv-infra)")
    result = subprocess.run([checkov, "-d", str(INFRA), "--framework", "terraform", "-o", "json", "--compact",
                             "--quiet", "--skip-download"], capture_output=True, text=True, timeout=300)
    assert result.stdout, result.stderr[-2000:]
    reports = json.loads(result.stdout)
    report = reports[0] if isinstance(reports, list) else reports
    summary = report["summary"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in report["results"]["failed_checks"]]
    assert failed == [] and summary["failed"] == 0
    assert summary["parsing_errors"] == 0 and summary["passed"] > 30 and summary["resource_count"] >= 10


def test_every_checkov_skip_gives_a_reason():
    skips = [line.strip() for path in INFRA.glob("*.tf") for line in path.read_text().splitlines()
             if "checkov:skip" in line]
    assert skips, "expected the documented skips"
    for line in skips:
        assert re.fullmatch(r"#checkov:skip=CKV2?_AWS_\d+:.{30,}", line), line


@pytest.fixture(scope="module")
def tf() -> dict:
    return load_terraform(INFRA)


def test_bucket_is_versioned_encrypted_and_private(tf):
    resource = tf["resource"]
    assert resource["aws_s3_bucket_versioning"]["rollout"]["versioning_configuration"][0]["status"] == "Enabled"
    rule = resource["aws_s3_bucket_server_side_encryption_configuration"]["rollout"]["rule"][0]
    default = rule["apply_server_side_encryption_by_default"][0]
    assert default["sse_algorithm"] == "aws:kms" and "aws_kms_key.rollout.arn" in default["kms_master_key_id"]
    assert resource["aws_kms_key"]["rollout"]["enable_key_rotation"] is True
    block = resource["aws_s3_bucket_public_access_block"]["rollout"]
    assert all(block[k] is True for k in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                                           "restrict_public_buckets"))
    ownership = resource["aws_s3_bucket_ownership_controls"]["rollout"]["rule"][0]["object_ownership"]
    assert ownership == "BucketOwnerEnforced"
    assert resource["aws_s3_bucket"]["rollout"]["force_destroy"] is False


def test_bucket_policy_denies_non_tls_and_unencrypted_writes(tf):
    assert "data.aws_iam_policy_document.bucket.json" in tf["resource"]["aws_s3_bucket_policy"]["rollout"]["policy"]
    statements = {s["sid"]: s for s in tf["data"]["aws_iam_policy_document"]["bucket"]["statement"]}
    tls = statements["DenyNonTlsRequests"]
    assert (tls["effect"], tls["actions"], _condition(tls)) == ("Deny", ["s3:*"], ("Bool", "aws:SecureTransport", ["false"]))
    unencrypted = statements["DenyUnencryptedWrites"]
    assert unencrypted["effect"] == "Deny" and unencrypted["actions"] == ["s3:PutObject"]
    assert _condition(unencrypted) == ("Null", "s3:x-amz-server-side-encryption", ["true"])
    assert _condition(statements["DenyWritesNotEncryptedWithKms"]) == (
        "StringNotEquals", "s3:x-amz-server-side-encryption", ["aws:kms"])
    for statement in statements.values():
        assert statement["principals"][0]["identifiers"] == ["*"]  # applies to everyone


def test_pipeline_policy_writes_only_the_store_and_never_deletes(tf):
    statements = tf["data"]["aws_iam_policy_document"]["pipeline_write"]["statement"]
    actions = {a for s in statements for a in s["actions"]}
    assert actions == {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "kms:Decrypt", "kms:GenerateDataKey"}
    for statement in statements:
        assert "*" not in statement["resources"]
    objects = next(s for s in statements if "s3:PutObject" in s["actions"])
    assert objects["resources"] == ["${local.store_arn}*"]
    listing = next(s for s in statements if "s3:ListBucket" in s["actions"])
    assert _condition(listing) == ("StringLike", "s3:prefix", ["${var.store_prefix}*"])


def test_device_policy_reads_one_model_only(tf):
    statements = tf["data"]["aws_iam_policy_document"]["device_read"]["statement"]
    assert {a for s in statements for a in s["actions"]} == {"s3:GetObject", "kms:Decrypt"}
    reads = next(s for s in statements if s["actions"] == ["s3:GetObject"])
    assert sorted(reads["resources"]) == ["${local.store_arn}${var.device_model}/channels/*",
                                          "${local.store_arn}${var.device_model}/versions/*",
                                          "${local.store_arn}root/*"]
    assert tf["locals"]["store_arn"] == "${aws_s3_bucket.rollout.arn}/${var.store_prefix}"


def test_outputs_and_variables(tf):
    assert {"store_uri", "kms_key_arn", "pipeline_policy_arn", "device_policy_arn", "signing_key_arn",
            "signer_role_arn"} <= set(tf["output"])
    assert {"region", "bucket_name", "store_prefix", "device_model", "access_log_bucket",
            "signer_principal_arns"} <= set(tf["variable"])


def test_bucket_policy_enforces_conditional_writes(tf):
    """S3 itself refuses an unconditional overwrite of a version (If-None-Match) or of a
    pointer (If-Match; If-None-Match only when it is created), whoever sends it."""
    statements = {s["sid"]: s for s in tf["data"]["aws_iam_policy_document"]["bucket"]["statement"]}
    versions = statements["DenyVersionWritesWithoutIfNoneMatch"]
    assert (versions["effect"], versions["actions"]) == ("Deny", ["s3:PutObject"])
    assert versions["resources"] == ["${local.store_arn}*/versions/*", "${local.store_arn}root/*"]
    assert _condition(versions) == ("Null", "s3:if-none-match", ["true"])
    pointers = statements["DenyPointerWritesWithoutIfMatch"]
    assert (pointers["effect"], pointers["actions"]) == ("Deny", ["s3:PutObject"])
    assert pointers["resources"] == ["${local.store_arn}*/channels/*"]
    conditions = {(c["test"], c["variable"], tuple(c["values"])) for c in pointers["condition"]}
    assert conditions == {("Null", "s3:if-match", ("true",)), ("Null", "s3:if-none-match", ("true",))}
    for statement in (versions, pointers):
        assert statement["principals"][0] == {"type": "*", "identifiers": ["*"]}


def test_release_signing_key_is_asymmetric_and_only_the_signer_role_signs(tf):
    resource, data = tf["resource"], tf["data"]["aws_iam_policy_document"]
    key = resource["aws_kms_key"]["release_signing"]
    assert (key["customer_master_key_spec"], key["key_usage"]) == ("ECC_NIST_P256", "SIGN_VERIFY")
    assert "data.aws_iam_policy_document.release_signing.json" in key["policy"]
    policy = {s["sid"]: s for s in data["release_signing"]["statement"]}
    assert "kms:Sign" not in policy["AccountAdministersTheKeyButDoesNotSign"]["actions"]
    assert not any(a in ("kms:*", "kms:Sign*") for a in policy["AccountAdministersTheKeyButDoesNotSign"]["actions"])
    assert policy["SignerRoleSigns"]["principals"][0]["identifiers"] == ["${aws_iam_role.release_signer.arn}"]
    deny = policy["NobodyElseSigns"]
    assert (deny["effect"], deny["actions"]) == ("Deny", ["kms:Sign"])
    assert _condition(deny) == ("ArnNotEquals", "aws:PrincipalArn", ["${aws_iam_role.release_signer.arn}"])
    signer = data["release_signer"]["statement"]
    assert [(s["actions"], s["resources"]) for s in signer] == [
        (["kms:Sign", "kms:GetPublicKey", "kms:DescribeKey"], ["${aws_kms_key.release_signing.arn}"])]
    trust = data["release_signer_trust"]["statement"][0]
    assert trust["principals"][0]["identifiers"] == "${var.signer_principal_arns}"


def test_the_bucket_writer_cannot_sign(tf):
    writer = tf["data"]["aws_iam_policy_document"]["pipeline_write"]["statement"]
    assert not any(a.startswith("kms:Sign") or a == "kms:*" for s in writer for a in s["actions"])
    assert all("release_signing" not in r for s in writer for r in s["resources"])


# --- parsing: python-hcl2 >= 7 (pinned) and the older output format -----------------------

def load_terraform(directory: Path) -> dict:
    """Every *.tf file merged into plain values: ``{"resource": {type: {name: body}},
    "data": ..., "variable": {name: body}, "output": ..., "locals": {name: value}}``, where
    a body maps attributes to values and nested blocks to lists of bodies."""
    merged: dict = {"resource": {}, "data": {}, "variable": {}, "output": {}, "locals": {}}
    for path in sorted(directory.glob("*.tf")):
        parsed, old = _parse(path.read_text())
        for kind in ("resource", "data"):
            for item in parsed.get(kind, []):
                for type_, named in item.items():
                    for name, body in named.items():
                        merged[kind].setdefault(type_, {})[name] = _body(body, old)
        for kind in ("variable", "output"):
            for item in parsed.get(kind, []):
                merged[kind].update({name: _body(body, old) for name, body in item.items()})
        for item in parsed.get("locals", []):
            merged["locals"].update(_body(item, old))
    return merged


def _parse(text: str) -> tuple[dict, bool]:
    import hcl2

    try:
        from hcl2.utils import SerializationOptions

        options = SerializationOptions(strip_string_quotes=True, explicit_blocks=True, with_comments=False)
        return hcl2.loads(text, serialization_options=options), False
    except (ImportError, TypeError):  # python-hcl2 < 7 (or bc-python-hcl2): values wrapped in lists
        return hcl2.loads(text), True


def _body(body: dict, old: bool) -> dict:
    plain = {}
    for key, value in body.items():
        if key.startswith("__") and key.endswith("__"):
            continue
        blocks = isinstance(value, list) and value and all(isinstance(v, dict) for v in value) and (
            old or all(v.get("__is_block__") for v in value))
        if blocks:
            plain[key] = [_body(v, old) for v in value]
        else:
            plain[key] = value[0] if old and isinstance(value, list) and len(value) == 1 else value
    return plain


def _condition(statement: dict) -> tuple[str, str, list]:
    condition = statement["condition"][0]
    return condition["test"], condition["variable"], condition["values"]
