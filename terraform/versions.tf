terraform {
  # 1.5 has every language feature used here (validation blocks, lifecycle
  # preconditions, templatefile) and is old enough for most installs.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}

provider "aws" {
  region = var.region

  # Every resource that supports tags gets these, so a forgotten lab is easy
  # to find (and bill-attribute) in the console or with the tagging API.
  default_tags {
    tags = local.common_tags
  }
}
