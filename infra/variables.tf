variable "region" {
  description = "AWS region of the rollout bucket."
  type        = string
}

variable "bucket_name" {
  description = "Name of the rollout bucket (globally unique)."
  type        = string
}

variable "store_prefix" {
  description = "Key prefix of the rollout store inside the bucket, ending in '/' (store URI s3://<bucket>/<prefix>)."
  type        = string
  default     = "rollout/"

  validation {
    condition     = can(regex("^([A-Za-z0-9._-]+/)+$", var.store_prefix))
    error_message = "store_prefix must be one or more path segments, each followed by '/'."
  }
}

variable "device_model" {
  description = "The model whose channels and versions the device policy may read."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", var.device_model))
    error_message = "device_model must be a store model name: letters, digits, '.', '_' and '-'."
  }
}

variable "access_log_bucket" {
  description = "Existing bucket that receives the server access logs of the rollout bucket."
  type        = string
}

variable "noncurrent_version_retention_days" {
  description = "Days an overwritten or deleted object version is kept before it expires (pointer history, accidental deletes)."
  type        = number
  default     = 365
}

variable "kms_deletion_window_days" {
  description = "Waiting period before the KMS key is deleted after a destroy."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}

variable "signer_principal_arns" {
  description = "Principals allowed to assume the release signer role (the release process, not every worker)."
  type        = list(string)

  validation {
    condition     = length(var.signer_principal_arns) > 0 && alltrue([for a in var.signer_principal_arns : can(regex("^arn:", a))])
    error_message = "signer_principal_arns must list at least one ARN."
  }
}
