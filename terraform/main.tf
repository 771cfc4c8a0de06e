data "aws_ec2_instance_type" "lab" {
  instance_type = var.instance_type
}

# Not every instance type is offered in every availability zone; picking the
# zone from the offerings avoids an apply that fails half-way through.
data "aws_ec2_instance_type_offerings" "lab" {
  location_type = "availability-zone"

  filter {
    name   = "instance-type"
    values = [var.instance_type]
  }
}

data "aws_ami" "ubuntu" {
  most_recent = true
  # Canonical's account: an owner filter stops a look-alike public AMI with a
  # matching name from being picked.
  owners = ["099720109477"]

  filter {
    name   = "name"
    values = [var.ami_name_filter]
  }

  filter {
    name   = "architecture"
    values = [local.architecture]
  }

  filter {
    name   = "virtualization-type"
    values = ["hvm"]
  }

  filter {
    name   = "root-device-type"
    values = ["ebs"]
  }
}

locals {
  architecture      = contains(data.aws_ec2_instance_type.lab.supported_architectures, "x86_64") ? "x86_64" : "arm64"
  availability_zone = try(sort(data.aws_ec2_instance_type_offerings.lab.locations)[0], null)

  # One /24 is plenty for at most 11 machines; fixed addresses let every
  # user_data know the server's address without waiting for the server.
  subnet_cidr       = cidrsubnet(var.vpc_cidr, 24 - tonumber(split("/", var.vpc_cidr)[1]), 0)
  server_private_ip = cidrhost(local.subnet_cidr, 10)
  client_count      = var.instance_count - 1

  # Fixed by the project's command-line interface (see README.md).
  certs_dir   = "/opt/secure-rdma/certs"
  tls_port    = 4433
  roce_port   = 4791
  max_clients = 10
  rxe_name    = "rxe0"

  common_tags = merge(var.tags, {
    Project   = "secure-rdma"
    Lab       = var.name_prefix
    ManagedBy = "terraform"
  })

  # Every value the user_data template reads besides role and client_name.
  user_data_vars = {
    repo_url          = var.repo_url
    repo_ref          = var.repo_ref
    server_private_ip = local.server_private_ip
    client_count      = local.client_count
    certs_dir         = local.certs_dir
    tls_port          = local.tls_port
    max_clients       = local.max_clients
    rxe_name          = local.rxe_name
  }
}

resource "aws_vpc" "lab" {
  # checkov:skip=CKV2_AWS_11: Flow logs would need a log group or bucket, a KMS key and an IAM role that outlive nothing in a lab destroyed after use; the only traffic sources are the lab's own instances and allowed_ssh_cidr.
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = {
    Name = "${var.name_prefix}-vpc"
  }
}

# Managing the default security group with no rules leaves it denying all
# traffic, so nothing attached to it by mistake is reachable.
resource "aws_default_security_group" "lab" {
  vpc_id = aws_vpc.lab.id

  tags = {
    Name = "${var.name_prefix}-default-deny"
  }
}

resource "aws_internet_gateway" "lab" {
  vpc_id = aws_vpc.lab.id

  tags = {
    Name = "${var.name_prefix}-igw"
  }
}

resource "aws_subnet" "lab" {
  vpc_id            = aws_vpc.lab.id
  cidr_block        = local.subnet_cidr
  availability_zone = local.availability_zone
  # Public addresses are requested per instance instead, so nothing else
  # launched into this subnet becomes reachable from the internet by default.
  map_public_ip_on_launch = false

  tags = {
    Name = "${var.name_prefix}-subnet"
  }

  lifecycle {
    precondition {
      condition     = local.availability_zone != null
      error_message = "Instance type ${var.instance_type} is not offered in any availability zone of ${var.region}."
    }
  }
}

resource "aws_route_table" "lab" {
  vpc_id = aws_vpc.lab.id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.lab.id
  }

  tags = {
    Name = "${var.name_prefix}-rt"
  }
}

resource "aws_route_table_association" "lab" {
  subnet_id      = aws_subnet.lab.id
  route_table_id = aws_route_table.lab.id
}

# Inline rules make Terraform authoritative over the whole rule set: a rule
# added by hand in the console is removed by the next apply.
resource "aws_security_group" "lab" {
  name        = "${var.name_prefix}-sg"
  description = "secure-rdma lab: SSH from the operator only; TLS control and RoCEv2 only between lab instances"
  vpc_id      = aws_vpc.lab.id

  ingress {
    description = "SSH from the operator's network (allowed_ssh_cidr) only"
    from_port   = 22
    to_port     = 22
    protocol    = "tcp"
    cidr_blocks = [var.allowed_ssh_cidr]
  }

  ingress {
    description = "secure-rdma TLS 1.3 control channel between lab instances"
    from_port   = local.tls_port
    to_port     = local.tls_port
    protocol    = "tcp"
    self        = true
  }

  # RoCEv2 is RDMA over UDP port 4791, not TCP.
  ingress {
    description = "RoCEv2 (Soft-RoCE) between lab instances"
    from_port   = local.roce_port
    to_port     = local.roce_port
    protocol    = "udp"
    self        = true
  }

  egress {
    description = "secure-rdma TLS 1.3 control channel to lab instances"
    from_port   = local.tls_port
    to_port     = local.tls_port
    protocol    = "tcp"
    self        = true
  }

  egress {
    description = "RoCEv2 (Soft-RoCE) to lab instances"
    from_port   = local.roce_port
    to_port     = local.roce_port
    protocol    = "udp"
    self        = true
  }

  # Outbound internet is limited to what first boot needs. DNS, NTP and the
  # metadata service go to link-local AWS addresses that security groups do
  # not filter.
  egress {
    description = "HTTPS for rustup, crates.io and git clone"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "HTTP for the Ubuntu archive mirrors (apt verifies package signatures)"
    from_port   = 80
    to_port     = 80
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  tags = {
    Name = "${var.name_prefix}-sg"
  }
}

# Cluster placement keeps the lab on one network spine, so latency numbers
# are about rxe rather than about how far apart AWS put the machines.
resource "aws_placement_group" "lab" {
  count    = var.placement_strategy == "cluster" ? 1 : 0
  name     = "${var.name_prefix}-pg"
  strategy = "cluster"

  tags = {
    Name = "${var.name_prefix}-pg"
  }
}

# Index 0 is the server, index N >= 1 is client-N.
resource "aws_instance" "lab" {
  # checkov:skip=CKV_AWS_88: The operator reaches each machine by SSH from allowed_ssh_cidr only, and first boot downloads packages; a bastion or NAT gateway would add cost and steps to a one-command lab.
  # checkov:skip=CKV2_AWS_41: The instances call no AWS API (metadata comes from IMDSv2, which needs no role), so an instance profile would only widen the lab's IAM footprint.
  count = var.instance_count

  ami                         = data.aws_ami.ubuntu.id
  instance_type               = var.instance_type
  key_name                    = var.key_name
  subnet_id                   = aws_subnet.lab.id
  private_ip                  = cidrhost(local.subnet_cidr, 10 + count.index)
  associate_public_ip_address = true
  vpc_security_group_ids      = [aws_security_group.lab.id]
  placement_group             = one(aws_placement_group.lab[*].id)
  ebs_optimized               = true
  # One-minute CPU metrics show when rxe, which does its transport work on
  # the CPU, is the bottleneck of a measurement.
  monitoring = true

  user_data = templatefile("${path.module}/user_data.sh.tftpl", merge(local.user_data_vars, {
    role        = count.index == 0 ? "server" : "client"
    client_name = count.index == 0 ? "" : "client-${count.index}"
  }))
  # A lab machine is cattle: a changed user_data means a fresh first boot.
  user_data_replace_on_change = true

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  root_block_device {
    volume_type           = "gp3"
    volume_size           = var.root_volume_size_gb
    encrypted             = true
    delete_on_termination = true

    # default_tags do not reach volumes created with the instance.
    tags = merge(local.common_tags, {
      Name = "${var.name_prefix}-${count.index == 0 ? "server" : "client-${count.index}"}-root"
    })
  }

  tags = {
    Name = "${var.name_prefix}-${count.index == 0 ? "server" : "client-${count.index}"}"
    Role = count.index == 0 ? "server" : "client"
  }

  # First boot downloads packages, so the default route must exist before
  # the instance starts.
  depends_on = [aws_route_table_association.lab]

  lifecycle {
    # A newer Ubuntu AMI being published must not replace a running lab.
    ignore_changes = [ami]

    precondition {
      condition     = !data.aws_ec2_instance_type.lab.burstable_performance_supported
      error_message = "Instance type ${var.instance_type} is burstable; CPU credits make Soft-RoCE numbers noisy. Choose a fixed-performance type such as c6i.large."
    }
  }
}
