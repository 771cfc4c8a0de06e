locals {
  # accept-new: the lab's host keys are new on every apply, and this still
  # refuses a changed key for an address already in known_hosts.
  ssh_opts = join(" ", compact([
    var.ssh_private_key_path == null ? "" : "-i ${var.ssh_private_key_path}",
    "-o StrictHostKeyChecking=accept-new",
  ]))

  server  = aws_instance.lab[0]
  clients = slice(aws_instance.lab, 1, var.instance_count)

  server_command = "secure-server --listen 0.0.0.0:${local.tls_port} --max-clients ${local.max_clients} --certs ${local.certs_dir}"
  client_commands = {
    for i, c in local.clients :
    "client-${i + 1}" => "secure-client ${local.server.private_ip} --port ${local.tls_port} --certs ${local.certs_dir} --name client-${i + 1}"
  }

  ssh_targets = merge(
    { server = "ubuntu@${local.server.public_ip}" },
    { for i, c in local.clients : "client-${i + 1}" => "ubuntu@${c.public_ip}" },
  )
  ssh_commands = { for name, target in local.ssh_targets : name => "ssh ${local.ssh_opts} ${target}" }

  # scp -3 relays through the workstation: the security group gives the
  # instances no SSH path to each other, and the private keys never enter
  # Terraform state.
  cert_copy_commands = {
    for i, c in local.clients :
    "client-${i + 1}" => join(" ", concat(
      ["scp -3 ${local.ssh_opts}"],
      [for f in ["ca.pem", "client-${i + 1}.pem", "client-${i + 1}.key"] : "ubuntu@${local.server.public_ip}:${local.certs_dir}/${f}"],
      ["ubuntu@${c.public_ip}:${local.certs_dir}/"],
    ))
  }

  # Lists rather than maps where order matters: maps iterate in key order,
  # which would put client-10 before client-2 and the server last.
  machine_names = concat(["server"], [for i, c in local.clients : "client-${i + 1}"])
  wait_commands = {
    for name, cmd in local.ssh_commands :
    name => "${cmd} 'cloud-init status --wait >/dev/null; cat /opt/secure-rdma/READY /opt/secure-rdma/FAILED 2>/dev/null'"
  }
  lab_instructions = join("\n", concat(
    ["1. Wait until first boot (packages, Soft-RoCE, build, certificates) has finished everywhere, about 10-15 minutes:"],
    [for name in local.machine_names : "     ${local.wait_commands[name]}"],
    ["2. Copy each client's CA certificate, certificate and key from the server:"],
    [for name in slice(local.machine_names, 1, var.instance_count) : "     ${local.cert_copy_commands[name]}"],
    ["3. Start the server:"],
    ["     ssh ${local.ssh_opts} -t ${local.ssh_targets["server"]} '${local.server_command}'"],
    ["4. In another terminal per client, run the client:"],
    [for name in slice(local.machine_names, 1, var.instance_count) : "     ssh ${local.ssh_opts} -t ${local.ssh_targets[name]} '${local.client_commands[name]}'"],
    [""],
  ))
}

output "server_public_ip" {
  description = "Public IPv4 address of the server (SSH only, from allowed_ssh_cidr)."
  value       = local.server.public_ip
}

output "server_private_ip" {
  description = "Private IPv4 address of the server: the address clients dial and a SAN of its certificate."
  value       = local.server.private_ip
}

output "client_public_ips" {
  description = "Public IPv4 address of each client (SSH only, from allowed_ssh_cidr)."
  value       = { for i, c in local.clients : "client-${i + 1}" => c.public_ip }
}

output "client_private_ips" {
  description = "Private IPv4 address of each client."
  value       = { for i, c in local.clients : "client-${i + 1}" => c.private_ip }
}

output "ssh_commands" {
  description = "SSH command for each lab machine."
  value       = local.ssh_commands
}

output "wait_commands" {
  description = "Commands that return once a machine's first boot (packages, Soft-RoCE, build, certificates) has finished; READY or FAILED tells the outcome."
  value       = local.wait_commands
}

output "cert_copy_commands" {
  description = "Run on your workstation once the server is ready: copies ca.pem and client-N's certificate and key from the server to client-N."
  value       = local.cert_copy_commands
}

output "server_command" {
  description = "Run on the server (over its SSH command)."
  value       = local.server_command
}

output "client_commands" {
  description = "Run on each client after its certificates are copied."
  value       = local.client_commands
}

output "lab_instructions" {
  description = "The whole run, step by step, server first."
  value       = local.lab_instructions
}
