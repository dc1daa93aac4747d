# The rollout store of onnxcast: one S3 bucket (versioned, KMS-encrypted by default, never
# public, TLS-only, unencrypted writes refused) and two least-privilege IAM policies: the
# pipeline writes the store prefix, a device reads one model's channels and versions.
# Layout inside the prefix (docs/architecture.md#contract-the-rollout-store):
#   <model>/versions/<version>/manifest.json, <artifact>.onnx   written once
#   <model>/channels/<channel>.json                              moved by compare-and-swap

terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.70, < 7.0" # conditional writes (If-None-Match / If-Match) in the SDK
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = merge({ "app" = "onnxcast", "component" = "rollout-store" }, var.tags)
  }
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account_root = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"
  bucket_arn   = aws_s3_bucket.rollout.arn
  store_arn    = "${aws_s3_bucket.rollout.arn}/${var.store_prefix}"
}

# --- encryption key -------------------------------------------------------------------------

resource "aws_kms_key" "rollout" {
  description             = "onnxcast rollout store ${var.bucket_name}"
  enable_key_rotation     = true
  deletion_window_in_days = var.kms_deletion_window_days
  policy                  = data.aws_iam_policy_document.kms.json
}

resource "aws_kms_alias" "rollout" {
  name          = "alias/onnxcast-${var.bucket_name}"
  target_key_id = aws_kms_key.rollout.key_id
}

# The account administers the key; use is granted by the IAM policies below.
data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_109:Key policy: Resource "*" is this key only, and the account root must administer it (AWS default key policy) or the key becomes unmanageable.
  #checkov:skip=CKV_AWS_111:Key policy: Resource "*" is this key only; writes to other resources are impossible from a key policy.
  #checkov:skip=CKV_AWS_356:Key policy: Resource "*" is the only valid resource in a KMS key policy and means this key.
  statement {
    sid       = "AccountAdministersTheKey"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy "*" is this key
    principals {
      type        = "AWS"
      identifiers = [local.account_root]
    }
  }
}

# --- bucket -----------------------------------------------------------------------------------

resource "aws_s3_bucket" "rollout" {
  #checkov:skip=CKV_AWS_144:Cross-region replication is a deployment choice; every version can be re-promoted from MLflow, which holds the same ONNX files.
  #checkov:skip=CKV2_AWS_62:No event consumers: devices poll their channel pointer (onnxcast edge pull --watch).
  bucket        = var.bucket_name
  force_destroy = false # versions are never deleted, not even by terraform destroy
}

resource "aws_s3_bucket_versioning" "rollout" {
  bucket = aws_s3_bucket.rollout.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "rollout" {
  bucket = aws_s3_bucket.rollout.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.rollout.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "rollout" {
  bucket                  = aws_s3_bucket.rollout.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "rollout" {
  bucket = aws_s3_bucket.rollout.id
  rule {
    object_ownership = "BucketOwnerEnforced" # ACLs off: access is IAM and bucket policy only
  }
}

resource "aws_s3_bucket_logging" "rollout" {
  bucket        = aws_s3_bucket.rollout.id
  target_bucket = var.access_log_bucket
  target_prefix = "s3/${var.bucket_name}/"
}

resource "aws_s3_bucket_lifecycle_configuration" "rollout" {
  bucket = aws_s3_bucket.rollout.id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  # Current objects never expire (versions are kept forever); only overwritten pointer
  # values and accidentally deleted objects age out, after a recovery window.
  rule {
    id     = "expire-noncurrent-object-versions"
    status = "Enabled"
    filter {}
    noncurrent_version_expiration {
      noncurrent_days = var.noncurrent_version_retention_days
    }
  }

  depends_on = [aws_s3_bucket_versioning.rollout]
}

resource "aws_s3_bucket_policy" "rollout" {
  bucket     = aws_s3_bucket.rollout.id
  policy     = data.aws_iam_policy_document.bucket.json
  depends_on = [aws_s3_bucket_public_access_block.rollout]
}

data "aws_iam_policy_document" "bucket" {
  statement {
    sid     = "DenyNonTlsRequests"
    effect  = "Deny"
    actions = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "DenyOldTls"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }

  # onnxcast sends the encryption header on every write (ONNXCAST_STORE_SSE=aws:kms).
  statement {
    sid       = "DenyUnencryptedWrites"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Null"
      variable = "s3:x-amz-server-side-encryption"
      values   = ["true"]
    }
  }

  statement {
    sid       = "DenyWritesNotEncryptedWithKms"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "StringNotEquals"
      variable = "s3:x-amz-server-side-encryption"
      values   = ["aws:kms"]
    }
  }

  statement {
    sid       = "DenyWritesWithAnotherKmsKey"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "StringNotEqualsIfExists"
      variable = "s3:x-amz-server-side-encryption-aws-kms-key-id"
      values   = [aws_kms_key.rollout.arn]
    }
  }

  # Conditional writes enforced by S3, not only sent by onnxcast: a version object (and a
  # published trust root) is written once, with If-None-Match, so nobody overwrites it.
  statement {
    sid       = "DenyVersionWritesWithoutIfNoneMatch"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["${local.store_arn}*/versions/*", "${local.store_arn}root/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Null"
      variable = "s3:if-none-match"
      values   = ["true"]
    }
  }

  # A pointer moves only from the value the writer read (If-Match on its ETag). The one
  # exception is its creation, which onnxcast sends with If-None-Match: both keys absent
  # (conditions of one statement are ANDed) is an unconditional overwrite, denied.
  statement {
    sid       = "DenyPointerWritesWithoutIfMatch"
    effect    = "Deny"
    actions   = ["s3:PutObject"]
    resources = ["${local.store_arn}*/channels/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Null"
      variable = "s3:if-match"
      values   = ["true"]
    }
    condition {
      test     = "Null"
      variable = "s3:if-none-match"
      values   = ["true"]
    }
  }
}

# --- IAM: the pipeline writes the store, a device reads one model ----------------------------

resource "aws_iam_policy" "pipeline_write" {
  name        = "onnxcast-rollout-write-${var.bucket_name}"
  description = "Promote and roll back models in s3://${var.bucket_name}/${var.store_prefix} (no deletes)."
  policy      = data.aws_iam_policy_document.pipeline_write.json
}

data "aws_iam_policy_document" "pipeline_write" {
  statement {
    sid       = "ListTheStore"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.store_prefix}*"]
    }
  }

  # Versions are written once (If-None-Match) and pointers moved with If-Match: PutObject
  # and GetObject only. No DeleteObject: versions are never deleted.
  statement {
    sid       = "ReadAndWriteTheStore"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.store_arn}*"]
  }

  statement {
    sid       = "UseTheBucketKey"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.rollout.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_policy" "device_read" {
  name        = "onnxcast-rollout-read-${var.bucket_name}-${var.device_model}"
  description = "Pull model ${var.device_model} from s3://${var.bucket_name}/${var.store_prefix} (read only)."
  policy      = data.aws_iam_policy_document.device_read.json
}

# A device reads its model's channel pointers and versions, nothing else. Without
# s3:ListBucket a missing key answers 403 rather than 404, which the edge client reports.
data "aws_iam_policy_document" "device_read" {
  statement {
    sid     = "ReadOneModel"
    actions = ["s3:GetObject"]
    resources = [
      "${local.store_arn}${var.device_model}/channels/*",
      "${local.store_arn}${var.device_model}/versions/*",
      "${local.store_arn}root/*", # the trust root chain (key rotation)
    ]
  }

  statement {
    sid       = "DecryptWithTheBucketKey"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.rollout.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com"]
    }
  }
}

# --- release signing: a KMS key only the signer role may use ---------------------------------
# Devices trust what the release keys sign, not what the bucket holds. The key that signs
# manifests and channel pointers lives in KMS (kms:Sign; the private key never leaves it)
# and only the signer role may sign: the workers' role writes the bucket but cannot sign,
# so a compromised worker can corrupt the store but cannot make a device install anything.

resource "aws_kms_key" "release_signing" {
  #checkov:skip=CKV_AWS_7:Automatic rotation exists for symmetric keys only; an asymmetric signing key rotates through a new trust root (onnxcast keys root --previous), which devices follow.
  description              = "onnxcast release signing key (manifests, channel pointers) for ${var.bucket_name}"
  customer_master_key_spec = "ECC_NIST_P256"
  key_usage                = "SIGN_VERIFY"
  deletion_window_in_days  = var.kms_deletion_window_days
  policy                   = data.aws_iam_policy_document.release_signing.json
}

resource "aws_kms_alias" "release_signing" {
  name          = "alias/onnxcast-release-${var.bucket_name}"
  target_key_id = aws_kms_key.release_signing.key_id
}

data "aws_iam_policy_document" "release_signing" {
  #checkov:skip=CKV_AWS_109:Key policy: Resource "*" is this key only; the account administers it but kms:Sign is denied to all but the signer role below.
  #checkov:skip=CKV_AWS_111:Key policy: Resource "*" is this key only; writes to other resources are impossible from a key policy.
  #checkov:skip=CKV_AWS_356:Key policy: Resource "*" is the only valid resource in a KMS key policy and means this key.
  statement {
    sid = "AccountAdministersTheKeyButDoesNotSign"
    actions = [
      "kms:Create*", "kms:Describe*", "kms:Enable*", "kms:List*", "kms:Put*", "kms:Update*", "kms:Revoke*",
      "kms:Disable*", "kms:Get*", "kms:Delete*", "kms:TagResource", "kms:UntagResource",
      "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion",
    ]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = [local.account_root]
    }
  }

  statement {
    sid       = "SignerRoleSigns"
    actions   = ["kms:Sign", "kms:GetPublicKey", "kms:DescribeKey"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.release_signer.arn]
    }
  }

  statement {
    sid       = "NobodyElseSigns"
    effect    = "Deny"
    actions   = ["kms:Sign"]
    resources = ["*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "ArnNotEquals"
      variable = "aws:PrincipalArn"
      values   = [aws_iam_role.release_signer.arn]
    }
  }
}

resource "aws_iam_role" "release_signer" {
  name               = "onnxcast-release-signer-${var.bucket_name}"
  description        = "Signs onnxcast release metadata with the KMS signing key; nothing else."
  assume_role_policy = data.aws_iam_policy_document.release_signer_trust.json
}

# Who may become the signer: the release process only (e.g. the service account of the
# promote/rollback/refresh tasks), never the role every worker runs as.
data "aws_iam_policy_document" "release_signer_trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "AWS"
      identifiers = var.signer_principal_arns
    }
  }
}

resource "aws_iam_role_policy" "release_signer" {
  name   = "sign-releases"
  role   = aws_iam_role.release_signer.id
  policy = data.aws_iam_policy_document.release_signer.json
}

data "aws_iam_policy_document" "release_signer" {
  statement {
    sid       = "SignWithTheReleaseKey"
    actions   = ["kms:Sign", "kms:GetPublicKey", "kms:DescribeKey"]
    resources = [aws_kms_key.release_signing.arn]
  }
}
