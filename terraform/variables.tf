variable "region" {
  description = "AWS region for the lab. The cost figures in README.md are for the default."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-[0-9]+$", var.region))
    error_message = "region must be an AWS region code such as us-east-1 or eu-west-1."
  }
}

variable "name_prefix" {
  description = "Prefix of every resource name and of the Name tags, so that several labs can share one account."
  type        = string
  default     = "secure-rdma-lab"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}[a-z0-9]$", var.name_prefix))
    error_message = "name_prefix must be 3-32 characters of lower-case letters, digits and '-', starting with a letter."
  }
}

variable "instance_type" {
  description = <<-EOT
    EC2 instance type of every lab machine. Must not be burstable (t2/t3/t3a/t4g,
    *-flex): CPU credits make Soft-RoCE numbers noisy, since rxe does its
    transport work on the CPU. The default, c6i.large, is compute-optimised
    x86_64 with 2 vCPUs and 4 GiB. Graviton types (c7g.large, ...) work too;
    the AMI architecture follows the instance type.
  EOT
  type        = string
  default     = "c6i.large"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]*\\.[a-z0-9]+$", var.instance_type))
    error_message = "instance_type must look like FAMILY.SIZE, for example c6i.large."
  }

  validation {
    condition     = !can(regex("^t[0-9]", var.instance_type)) && !can(regex("-flex\\.", var.instance_type))
    error_message = "Burstable instance types (t2, t3, t3a, t4g, *-flex) make rxe measurements noisy; choose a fixed-performance type such as c6i.large."
  }
}

variable "instance_count" {
  description = "Number of lab machines: the first is the server, every other one a client (client-1, client-2, ...). The server is started with --max-clients 10."
  type        = number
  default     = 2

  validation {
    condition     = var.instance_count >= 2 && var.instance_count <= 11 && floor(var.instance_count) == var.instance_count
    error_message = "instance_count must be a whole number from 2 (one server, one client) to 11 (one server, ten clients: the server's --max-clients)."
  }
}

variable "key_name" {
  description = "Name of an existing EC2 key pair in the region; its public key is installed for the 'ubuntu' user. Terraform never sees the private key."
  type        = string

  validation {
    condition     = length(var.key_name) >= 1 && length(var.key_name) <= 255 && can(regex("^[ -~]+$", var.key_name))
    error_message = "key_name must be the 1-255 character ASCII name of an existing EC2 key pair."
  }
}

variable "ssh_private_key_path" {
  description = "Path of the key pair's private key on your workstation. Used only to print ready-to-paste ssh/scp commands; Terraform does not read the file. Null leaves -i out of the commands (ssh-agent or ~/.ssh/config then picks the key)."
  type        = string
  default     = null

  validation {
    condition     = var.ssh_private_key_path == null || can(regex("^[A-Za-z0-9_./~+-]+$", coalesce(var.ssh_private_key_path, "x")))
    error_message = "ssh_private_key_path may only contain letters, digits and _ . / ~ + - so that the printed commands can be pasted into a shell as they are."
  }
}

variable "allowed_ssh_cidr" {
  description = "IPv4 CIDR allowed to reach port 22 of the lab, normally your own address as a /32 (for example the output of `curl -s https://checkip.amazonaws.com` followed by /32). There is deliberately no default and 0.0.0.0/0 is refused."
  type        = string

  validation {
    condition = (
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/[0-9]{1,2}$", var.allowed_ssh_cidr)) &&
      try(cidrsubnet(var.allowed_ssh_cidr, 0, 0) == var.allowed_ssh_cidr, false) &&
      try(tonumber(split("/", var.allowed_ssh_cidr)[1]) >= 8, false)
    )
    error_message = "allowed_ssh_cidr must be one IPv4 network in CIDR form with its network address and a prefix of /8 or longer, e.g. 203.0.113.7/32. 0.0.0.0/0 (SSH open to the internet) is refused."
  }
}

variable "repo_url" {
  description = "HTTPS URL of a git repository holding this project (your fork or mirror); every instance clones it at boot. It must be clonable without credentials, because anything put here lands in user_data and the Terraform state."
  type        = string

  validation {
    condition     = can(regex("^https://[A-Za-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9._~/+-]+$", var.repo_url))
    error_message = "repo_url must be an https:// git URL without credentials, query or fragment, e.g. https://github.com/OWNER/secure-rdma.git."
  }
}

variable "repo_ref" {
  description = "Branch, tag or commit of repo_url to build."
  type        = string
  default     = "main"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$", var.repo_ref)) && !can(regex("\\.\\.", var.repo_ref))
    error_message = "repo_ref must be a plain git branch, tag or commit name (letters, digits, . _ / -; no '..')."
  }
}

variable "ami_name_filter" {
  description = "Name filter for the Ubuntu 24.04 (noble) AMI, owned by Canonical, that every instance boots; the most recent match for the instance type's architecture is used. The user_data relies on Ubuntu 24.04 package names."
  type        = string
  default     = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-*-server-*"

  validation {
    condition     = can(regex("ubuntu-noble-24\\.04", var.ami_name_filter))
    error_message = "ami_name_filter must select an Ubuntu 24.04 (ubuntu-noble-24.04) image: user_data installs Ubuntu 24.04 packages."
  }
}

variable "vpc_cidr" {
  description = "IPv4 CIDR of the lab's own VPC. The lab subnet is the first /24 in it; the server gets its .10 address and client N its .(10+N)."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition = (
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/[0-9]{1,2}$", var.vpc_cidr)) &&
      try(cidrsubnet(var.vpc_cidr, 0, 0) == var.vpc_cidr, false) &&
      try(tonumber(split("/", var.vpc_cidr)[1]) >= 16 && tonumber(split("/", var.vpc_cidr)[1]) <= 24, false)
    )
    error_message = "vpc_cidr must be an IPv4 network in CIDR form with its network address and a prefix from /16 to /24 (the AWS VPC size limits)."
  }
}

variable "root_volume_size_gb" {
  description = "Size of each encrypted gp3 root volume in GiB. The Rust toolchain and a release build of the workspace need about 8 GiB on top of the OS."
  type        = number
  default     = 30

  validation {
    condition     = var.root_volume_size_gb >= 16 && var.root_volume_size_gb <= 200 && floor(var.root_volume_size_gb) == var.root_volume_size_gb
    error_message = "root_volume_size_gb must be a whole number from 16 to 200."
  }
}

variable "placement_strategy" {
  description = "\"cluster\" puts the lab in one cluster placement group, so that RoCEv2 latency numbers come from machines on the same network spine; \"none\" drops the placement group (use it if AWS answers InsufficientInstanceCapacity)."
  type        = string
  default     = "cluster"

  validation {
    condition     = contains(["cluster", "none"], var.placement_strategy)
    error_message = "placement_strategy must be \"cluster\" or \"none\"."
  }
}

variable "tags" {
  description = "Extra tags for every resource, e.g. { Owner = \"alice\", CostCenter = \"rnd\" }."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.tags) : length(k) >= 1 && length(k) <= 128 && !startswith(lower(k), "aws:")])
    error_message = "Tag keys must be 1-128 characters and must not start with the reserved prefix aws:."
  }
}
