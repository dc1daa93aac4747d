output "bucket" {
  description = "Name of the rollout bucket."
  value       = aws_s3_bucket.rollout.bucket
}

output "store_uri" {
  description = "The --store URI for onnxcast promote / rollback / edge pull."
  value       = "s3://${aws_s3_bucket.rollout.bucket}/${trimsuffix(var.store_prefix, "/")}"
}

output "kms_key_arn" {
  description = "KMS key of the bucket: set ONNXCAST_STORE_SSE=aws:kms and ONNXCAST_STORE_SSE_KMS_KEY_ID to this."
  value       = aws_kms_key.rollout.arn
}

output "pipeline_policy_arn" {
  description = "IAM policy to attach to the role of the pipeline (Airflow workers) that promotes and rolls back."
  value       = aws_iam_policy.pipeline_write.arn
}

output "device_policy_arn" {
  description = "IAM policy to attach to the role of the devices that pull var.device_model."
  value       = aws_iam_policy.device_read.arn
}

output "signing_key_arn" {
  description = "KMS release signing key: ONNXCAST_SIGNING_KEY=awskms:<this>; its public key: onnxcast keys kms-pub."
  value       = aws_kms_key.release_signing.arn
}

output "signer_role_arn" {
  description = "The only role that may sign releases (kms:Sign) with the signing key."
  value       = aws_iam_role.release_signer.arn
}
