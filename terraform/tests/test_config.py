#!/usr/bin/env python3
"""Static and offline checks of the Terraform Soft-RoCE lab in terraform/.

Run by scripts/check-terraform.sh inside a venv that has python-hcl2. Every
check prints one PASS/FAIL/SKIP line; the last line is "N passed, N failed,
N skipped" and the exit status is non-zero when anything failed.

Without network access the AWS provider cannot be installed, so nothing here
talks to AWS. Where `terraform` is on PATH, the parts that need no provider
are still run for real: variable validation (a configuration of only
variables.tf), outputs.tf (with the instances replaced by stand-ins) and the
user_data template (compared byte for byte with this script's renderer).

  --render-dir DIR   also write the user_data rendered for each role to
                     DIR/user_data.<role>.sh (for shellcheck)
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import hcl2

TF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(TF_DIR)
TEMPLATE = os.path.join(TF_DIR, "user_data.sh.tftpl")

# EC2 refuses user_data over 16 KiB (before base64).
USER_DATA_LIMIT = 16384
CANONICAL_OWNER = "099720109477"
EXPECTED_VARIABLES = {
    "region", "instance_type", "instance_count", "key_name", "allowed_ssh_cidr",
    "ami_name_filter", "repo_url", "repo_ref",
}
EXPECTED_OUTPUTS = {
    "server_public_ip", "server_private_ip", "client_public_ips", "client_private_ips",
    "ssh_commands", "server_command", "client_commands", "cert_copy_commands",
}
# Resource types that take tags; each must carry a Name tag.
TAGGABLE = {
    "aws_vpc", "aws_subnet", "aws_internet_gateway", "aws_route_table",
    "aws_security_group", "aws_default_security_group", "aws_instance",
    "aws_placement_group",
}
# Resources that would add security group rules behind the inline set's back.
RULE_RESOURCES = {
    "aws_security_group_rule", "aws_vpc_security_group_ingress_rule",
    "aws_vpc_security_group_egress_rule",
}
REQUIRED_PACKAGES = [
    "linux-modules-extra-$kernel", "rdma-core", "ibverbs-utils", "ibverbs-providers",
    "perftest", "libibverbs-dev", "librdmacm-dev", "build-essential", "cmake", "clang",
    "llvm", "pkg-config", "libbpf-dev", "linux-tools-common", "linux-tools-$kernel",
]


class Results:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        return ok

    def skip(self, name, why):
        self.skipped += 1
        print(f"SKIP {name}: {why}")


def load_tf(path):
    with open(path, encoding="utf-8") as f:
        try:
            from hcl2.utils import SerializationOptions
        except ImportError:  # python-hcl2 < 7 already returns this shape
            return hcl2.load(f)
        opts = SerializationOptions(
            with_comments=False, explicit_blocks=False,
            strip_string_quotes=True, preserve_heredocs=False,
        )
        return hcl2.load(f, serialization_options=opts)


class Config:
    """The merged top-level blocks of every .tf file."""

    def __init__(self, docs):
        self.resources, self.data, self.variables, self.outputs = {}, {}, {}, {}
        self.locals, self.providers, self.terraform = {}, {}, []
        for doc in docs.values():
            for block in doc.get("resource", []):
                for rtype, named in block.items():
                    self.resources.setdefault(rtype, {}).update(named)
            for block in doc.get("data", []):
                for dtype, named in block.items():
                    self.data.setdefault(dtype, {}).update(named)
            for block in doc.get("variable", []):
                self.variables.update(block)
            for block in doc.get("output", []):
                self.outputs.update(block)
            for block in doc.get("locals", []):
                self.locals.update(block)
            for block in doc.get("provider", []):
                self.providers.update(block)
            self.terraform.extend(doc.get("terraform", []))


def resolve(cfg, value):
    """Value of a literal or of a bare ${local.x} reference to a literal."""
    if isinstance(value, str):
        m = re.fullmatch(r"\$\{local\.([A-Za-z0-9_]+)\}", value)
        if m and m.group(1) in cfg.locals:
            return resolve(cfg, cfg.locals[m.group(1)])
    return value


# --- user_data template --------------------------------------------------

TEMPLATE_TOKEN = re.compile(r"\$\$\{|%%\{|\$\{([^}]*)\}|%\{")


def template_names(text):
    return {m.group(1).strip() for m in TEMPLATE_TOKEN.finditer(text) if m.group(1) is not None}


def render_template(text, values):
    """Terraform's templatefile() for the subset the template may use:
    ${name} interpolation and the $${ / %%{ escapes. Anything else (an
    expression or a %{ directive) is refused, so that the shell that
    shellcheck reads is exactly what an instance runs."""

    def sub(m):
        tok = m.group(0)
        if tok == "$${":
            return "${"
        if tok == "%%{":
            return "%{"
        if tok == "%{":
            raise ValueError("template directives (%{...}) are not supported by the test renderer")
        name = m.group(1).strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"template expression ${{{name}}} is not a plain variable")
        if name not in values:
            raise ValueError(f"template variable {name} has no value")
        return str(values[name])

    return TEMPLATE_TOKEN.sub(sub, text)


def sample_values(cfg, role):
    """Values like the ones main.tf passes, for a 3-machine lab."""
    values = {}
    literal = {
        "repo_url": "https://git.example.org/secure-rdma/secure-rdma.git",
        "repo_ref": "main",
        "server_private_ip": "10.42.0.10",
        "client_count": 2,
    }
    for key, expr in cfg.locals.get("user_data_vars", {}).items():
        v = resolve(cfg, expr)
        values[key] = literal.get(key, v)
    values["role"] = role
    values["client_name"] = "client-1" if role == "client" else ""
    return values


# --- helpers for terraform runs -----------------------------------------

def terraform_env():
    env = dict(os.environ, CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1")
    cli_cfg = env.get("TF_CLI_CONFIG_FILE")
    if cli_cfg and not os.path.exists(cli_cfg):
        del env["TF_CLI_CONFIG_FILE"]
    return env


def tf(workdir, *args):
    return subprocess.run(
        ["terraform", *args], cwd=workdir, env=terraform_env(),
        capture_output=True, text=True, timeout=120,
    )


# --- the checks ----------------------------------------------------------

def check_parse(r):
    docs = {}
    for name in sorted(os.listdir(TF_DIR)):
        if not name.endswith(".tf"):
            continue
        try:
            docs[name] = load_tf(os.path.join(TF_DIR, name))
            r.check(f"parse {name}", True)
        except Exception as e:  # noqa: BLE001 - report any parser error as a failure
            r.check(f"parse {name}", False, f"{type(e).__name__}: {e}")
    r.check("configuration has versions.tf, variables.tf, main.tf, outputs.tf",
            {"versions.tf", "variables.tf", "main.tf", "outputs.tf"} <= set(docs), sorted(docs))
    return Config(docs)


def check_provider(r, cfg):
    aws = {}
    for block in cfg.terraform:
        for rp in block.get("required_providers", []):
            aws = rp.get("aws", aws)
    r.check("required provider hashicorp/aws ~> 5",
            aws.get("source") == "hashicorp/aws" and re.fullmatch(r"~>\s*5(\.\d+)*", str(aws.get("version", ""))),
            str(aws))
    prov = cfg.providers.get("aws", {})
    r.check("provider has no credentials in it",
            not ({"access_key", "secret_key", "token", "profile"} & set(prov)), sorted(prov))
    r.check("provider sets default_tags", bool(prov.get("default_tags")))


def check_variables(r, cfg):
    missing = EXPECTED_VARIABLES - set(cfg.variables)
    r.check("variables: region, instance type/count, key, ssh cidr, ami filter, repo url/ref exist",
            not missing, f"missing {sorted(missing)}")
    for name, body in sorted(cfg.variables.items()):
        ok = bool(str(body.get("description", "")).strip()) and bool(body.get("validation"))
        r.check(f"variable {name} has a description and a validation block", ok)

    ssh = cfg.variables.get("allowed_ssh_cidr", {})
    r.check("allowed_ssh_cidr has no default", "default" not in ssh, f"default = {ssh.get('default')!r}")
    conds = " ".join(v.get("condition", "") for v in ssh.get("validation", []))
    m = re.search(r'split\("/",\s*var\.allowed_ssh_cidr\)\[1\]\)\s*>=\s*(\d+)', conds)
    r.check("allowed_ssh_cidr validation demands a prefix length >= 1 (rejects 0.0.0.0/0)",
            bool(m) and int(m.group(1)) >= 1, conds)

    it = cfg.variables.get("instance_type", {})
    default = str(it.get("default", ""))
    r.check(f"instance_type default {default} is compute-optimised and not burstable",
            re.match(r"^c\d", default) is not None and not re.match(r"^t\d", default) and "-flex." not in default)
    r.check("instance_count defaults to 2 (one server, one client)",
            cfg.variables.get("instance_count", {}).get("default") == 2)
    r.check("repo_ref defaults to main", cfg.variables.get("repo_ref", {}).get("default") == "main")
    r.check("repo_url is required (no default)", "default" not in cfg.variables.get("repo_url", {}))
    ami = cfg.variables.get("ami_name_filter", {})
    r.check("ami_name_filter defaults to Ubuntu 24.04 (noble)", "ubuntu-noble-24.04" in str(ami.get("default", "")))


def check_network(r, cfg):
    res = cfg.resources
    for rtype in ("aws_vpc", "aws_subnet", "aws_internet_gateway", "aws_route_table",
                  "aws_route_table_association", "aws_security_group", "aws_instance"):
        r.check(f"resource {rtype} exists", rtype in res)

    routes = [rt for t in res.get("aws_route_table", {}).values() for rt in t.get("route", [])]
    r.check("a route sends 0.0.0.0/0 to the internet gateway",
            any(rt.get("cidr_block") == "0.0.0.0/0" and "aws_internet_gateway." in str(rt.get("gateway_id"))
                for rt in routes))
    for name, sn in res.get("aws_subnet", {}).items():
        r.check(f"subnet {name} does not map public IPs on launch", sn.get("map_public_ip_on_launch") is False)

    dsg = res.get("aws_default_security_group", {})
    r.check("the VPC's default security group is managed with no rules",
            bool(dsg) and all(not b.get("ingress") and not b.get("egress") for b in dsg.values()))

    extra = RULE_RESOURCES & set(res)
    r.check("no standalone security group rule resources", not extra, sorted(extra))

    sgs = res.get("aws_security_group", {})
    r.check("exactly one security group", len(sgs) == 1, sorted(sgs))
    for name, sg in sgs.items():
        rules = []
        for rule in sg.get("ingress", []):
            port_from, port_to = resolve(cfg, rule.get("from_port")), resolve(cfg, rule.get("to_port"))
            if rule.get("self") is True and not rule.get("cidr_blocks"):
                source = "self"
            else:
                source = ",".join(rule.get("cidr_blocks", []) + rule.get("ipv6_cidr_blocks", [])
                                  + rule.get("security_groups", []) + rule.get("prefix_list_ids", []))
                if rule.get("self"):
                    source += ",self"
            rules.append((port_from, port_to, rule.get("protocol"), source))
        expected = [
            (22, 22, "tcp", "${var.allowed_ssh_cidr}"),
            (4433, 4433, "tcp", "self"),
            (4791, 4791, "udp", "self"),
        ]
        r.check(f"security group {name}: inbound is exactly 22/tcp from allowed_ssh_cidr, "
                "4433/tcp and 4791/udp from itself",
                sorted(rules, key=str) == sorted(expected, key=str), str(rules))
        all_rules = sg.get("ingress", []) + sg.get("egress", [])
        r.check(f"security group {name}: group and every rule have a description",
                bool(sg.get("description")) and all(x.get("description") for x in all_rules))
        bad_egress = [e for e in sg.get("egress", [])
                      if str(e.get("protocol")) in ("-1", "all") or
                      (resolve(cfg, e.get("from_port")), resolve(cfg, e.get("to_port"))) == (0, 65535)]
        r.check(f"security group {name}: no all-protocol or all-port egress", not bad_egress, str(bad_egress))
        egress = {(resolve(cfg, e.get("from_port")), e.get("protocol"), bool(e.get("self")))
                  for e in sg.get("egress", [])}
        r.check(f"security group {name}: egress lets the lab reach itself on 4433/tcp and 4791/udp",
                {(4433, "tcp", True), (4791, "udp", True)} <= egress, str(egress))


def check_instances(r, cfg):
    instances = cfg.resources.get("aws_instance", {})
    for name, inst in instances.items():
        md = (inst.get("metadata_options") or [{}])[0]
        r.check(f"aws_instance.{name}: IMDSv2 required (http_tokens = required, hop limit 1)",
                md.get("http_tokens") == "required" and md.get("http_put_response_hop_limit") == 1, str(md))
        roots = inst.get("root_block_device") or []
        r.check(f"aws_instance.{name}: root volume encrypted",
                bool(roots) and all(rb.get("encrypted") is True for rb in roots), str(roots))
        r.check(f"aws_instance.{name}: no unencrypted extra EBS volume",
                all(b.get("encrypted") is True for b in inst.get("ebs_block_device", [])))
        r.check(f"aws_instance.{name}: user_data is rendered from user_data.sh.tftpl",
                "templatefile(" in str(inst.get("user_data")) and "user_data.sh.tftpl" in str(inst.get("user_data")))
        r.check(f"aws_instance.{name}: count follows var.instance_count",
                str(inst.get("count")) == "${var.instance_count}")
        r.check(f"aws_instance.{name}: root volume tagged", "Name" in str(roots))
    ebs = cfg.resources.get("aws_ebs_volume", {})
    r.check("every aws_ebs_volume is encrypted", all(v.get("encrypted") is True for v in ebs.values()))

    amis = cfg.data.get("aws_ami", {})
    r.check("AMI is looked up by filter, owned by Canonical",
            bool(amis) and all(CANONICAL_OWNER in a.get("owners", []) and a.get("filter") for a in amis.values()))


def check_tags(r, cfg):
    untagged = [f"{t}.{n}" for t, named in cfg.resources.items() if t in TAGGABLE
                for n, body in named.items() if "Name" not in (body.get("tags") or {})]
    r.check("every taggable resource has a Name tag", not untagged, str(untagged))


def check_no_secrets(r):
    pattern = re.compile(r"AKIA[0-9A-Z]{16}|aws_secret_access_key|BEGIN [A-Z ]*PRIVATE KEY|"
                         r'resource\s+"tls_private_key"|hashicorp/tls')
    hits = []
    for root, _dirs, files in os.walk(TF_DIR):
        if ".terraform" in root or "__pycache__" in root:
            continue
        for name in files:
            if name.endswith((".tf", ".tftpl", ".tfvars", ".example")):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    if pattern.search(f.read()):
                        hits.append(os.path.relpath(path, TF_DIR))
    r.check("no credentials, private keys or tls provider keys (which would land in state)", not hits, str(hits))


def check_checkov_skips(r):
    """Every checkov:skip must say why; prints them for the report."""
    skip = re.compile(r"checkov:skip=([A-Z0-9_]+)(.*)")
    found, bad = [], []
    for root, _dirs, files in os.walk(TF_DIR):
        if ".terraform" in root:
            continue
        for name in sorted(files):
            if not name.endswith((".tf", ".tftpl")):
                continue
            with open(os.path.join(root, name), encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    m = skip.search(line)
                    if not m:
                        continue
                    reason = re.sub(r"^\s*:\s*", "", m.group(2)).strip()
                    where = f"{name}:{lineno}"
                    found.append((where, m.group(1), reason))
                    if not m.group(2).lstrip().startswith(":") or len(reason) < 20:
                        bad.append(f"{where} {m.group(1)}")
    for where, check_id, reason in found:
        print(f"     skip {check_id} at {where}: {reason}")
    r.check(f"all {len(found)} checkov:skip comments carry a reason (ID: reason, >= 20 chars)", not bad, str(bad))


def check_tfvars_example(r, cfg):
    path = os.path.join(TF_DIR, "terraform.tfvars.example")
    if not r.check("terraform.tfvars.example exists", os.path.exists(path)):
        return
    try:
        values = load_tf(path)
    except Exception as e:  # noqa: BLE001
        r.check("parse terraform.tfvars.example", False, f"{type(e).__name__}: {e}")
        return
    required = {n for n, v in cfg.variables.items() if "default" not in v}
    r.check("terraform.tfvars.example sets every required variable and only declared ones",
            required <= set(values) <= set(cfg.variables), f"sets {sorted(values)}, required {sorted(required)}")


def check_outputs(r, cfg):
    missing = EXPECTED_OUTPUTS - set(cfg.outputs)
    r.check("outputs: IPs, SSH commands, cert copy commands, server and client command lines",
            not missing, f"missing {sorted(missing)}")
    r.check("every output has a description",
            all(str(o.get("description", "")).strip() for o in cfg.outputs.values()))
    loc = cfg.locals
    r.check("server command line is secure-server --listen 0.0.0.0:4433 --max-clients 10 --certs /opt/secure-rdma/certs",
            loc.get("server_command") == "secure-server --listen 0.0.0.0:${local.tls_port} --max-clients "
                                         "${local.max_clients} --certs ${local.certs_dir}"
            and loc.get("tls_port") == 4433 and loc.get("max_clients") == 10
            and loc.get("certs_dir") == "/opt/secure-rdma/certs", str(loc.get("server_command")))
    r.check("client command line dials the server's private IP with --name client-N",
            "secure-client ${local.server.private_ip} --port ${local.tls_port} --certs ${local.certs_dir} "
            "--name client-${i + 1}" in str(loc.get("client_commands")))


def check_template(r, cfg, render_dir):
    with open(TEMPLATE, encoding="utf-8") as f:
        text = f.read()
    r.check("user_data starts with #!/bin/bash (cloud-init runs it as a script)", text.startswith("#!/bin/bash\n"))
    r.check("user_data uses no template directives (%{ }), so shellcheck sees what instances run",
            not re.search(r"(?<!%)%\{", text))
    names = template_names(text)
    passed = set(cfg.locals.get("user_data_vars", {})) | {"role", "client_name"}
    r.check("template variables are exactly the ones main.tf passes",
            names == passed, f"template only: {sorted(names - passed)}, main.tf only: {sorted(passed - names)}")
    r.check("user_data installs linux-modules-extra for the running kernel",
            re.search(r"kernel=\$\(uname -r\)", text) is not None and '"linux-modules-extra-$kernel"' in text)
    missing = [p for p in REQUIRED_PACKAGES if p not in text]
    r.check("user_data installs rdma-core, perftest and the build dependencies", not missing, str(missing))
    r.check("user_data runs scripts/setup-softroce.sh",
            re.search(r'^bash "\$src_dir/scripts/setup-softroce\.sh"', text, re.M) is not None)
    r.check("user_data keeps rxe across reboots (systemd unit after network-online.target)",
            all(s in text for s in ("After=network-online.target", "WantedBy=multi-user.target",
                                    "systemctl enable", "--teardown")))
    r.check("user_data clones repo_url at repo_ref", "git clone" in text and "checkout" in text)
    r.check("user_data builds secure-server and secure-client",
            "cargo\" build --release" in text and "-p secure-rdma-server -p secure-rdma-client" in text)
    r.check("user_data creates the CA/server certificate and a certificate per client",
            "certs init --dir" in text and "certs client \"client-$i\"" in text and '--san "$local_ip"' in text)
    r.check("user_data reads the instance address through IMDSv2 (token first)",
            "latest/api/token" in text and "X-aws-ec2-metadata-token:" in text)

    rendered = {}
    for role in ("server", "client"):
        try:
            rendered[role] = render_template(text, sample_values(cfg, role))
            ok = r.check(f"render user_data for the {role}", True)
        except ValueError as e:
            ok = r.check(f"render user_data for the {role}", False, str(e))
        if ok:
            size = len(rendered[role].encode())
            r.check(f"rendered {role} user_data is {size} bytes, under EC2's {USER_DATA_LIMIT}", size < USER_DATA_LIMIT)
            if render_dir:
                with open(os.path.join(render_dir, f"user_data.{role}.sh"), "w", encoding="utf-8") as f:
                    f.write(rendered[role])
    return rendered


def check_scripts(r):
    """The lab runs the repository's own setup script; check the interface it relies on."""
    setup = os.path.join(REPO_DIR, "scripts", "setup-softroce.sh")
    if not os.path.exists(setup):
        r.skip("scripts/setup-softroce.sh offers --name, --teardown and --quiet", "script not in the tree yet")
    else:
        with open(setup, encoding="utf-8") as f:
            body = f.read()
        missing = [o for o in ("--name", "--teardown", "--quiet") if o not in body]
        r.check("scripts/setup-softroce.sh offers --name, --teardown and --quiet", not missing, f"missing {missing}")
    vm = os.path.join(REPO_DIR, "scripts", "softroce-vm.sh")
    if not os.path.exists(vm):
        r.skip("the lab VM suite runs the same setup-softroce.sh", "scripts/softroce-vm.sh not in the tree yet")
    else:
        with open(vm, encoding="utf-8") as f:
            r.check("the lab VM suite (scripts/softroce-vm.sh) runs the same setup-softroce.sh",
                    "setup-softroce.sh" in f.read())


def check_validation_with_terraform(r):
    """Variable validation, evaluated by terraform itself on a configuration of
    variables.tf alone (no provider needed)."""
    name = "terraform evaluates variable validation"
    if not shutil.which("terraform"):
        r.skip(name, "terraform not on PATH")
        return
    good = {
        "key_name": "lab-key", "allowed_ssh_cidr": "203.0.113.7/32",
        "repo_url": "https://github.com/example/secure-rdma.git",
    }
    bad = [
        ("allowed_ssh_cidr", "0.0.0.0/0"), ("allowed_ssh_cidr", "::/0"),
        ("allowed_ssh_cidr", "10.0.0.0/4"), ("allowed_ssh_cidr", "203.0.113.7/24"),
        ("allowed_ssh_cidr", "not-a-cidr"),
        ("instance_type", "t3.large"), ("instance_type", "t4g.medium"), ("instance_type", "m7i-flex.large"),
        ("instance_count", "1"), ("instance_count", "12"), ("instance_count", "2.5"),
        ("repo_url", "http://github.com/example/secure-rdma.git"),
        ("repo_url", "https://user:token@github.com/example/secure-rdma.git"),
        ("repo_url", "https://github.com/x/y.git;reboot"),
        ("repo_ref", "../../etc"), ("repo_ref", "main'; reboot; '"),
        ("region", "US-EAST-1"), ("ami_name_filter", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-*"),
        ("vpc_cidr", "10.42.0.0/8"), ("key_name", ""), ("ssh_private_key_path", "~/.ssh/id rsa"),
    ]
    accepted = [
        ("instance_type", "c7g.large"), ("instance_count", "11"), ("allowed_ssh_cidr", "198.51.100.0/24"),
        ("repo_ref", "v1.2.3"), ("ssh_private_key_path", "~/.ssh/id_ed25519"),
    ]
    with tempfile.TemporaryDirectory(prefix="tf-validate-") as d:
        shutil.copy(os.path.join(TF_DIR, "variables.tf"), d)
        init = tf(d, "init", "-backend=false", "-input=false", "-no-color")
        if init.returncode != 0:
            r.check(name, False, init.stderr.strip()[-400:])
            return

        def plan(overrides):
            values = dict(good, **overrides)
            args = ["plan", "-input=false", "-lock=false", "-no-color", "-refresh=false"]
            for k, v in values.items():
                args += ["-var", f"{k}={v}"]
            return tf(d, *args)

        p = plan({})
        r.check("terraform accepts a valid set of variables", p.returncode == 0, p.stderr.strip()[-400:])
        example = os.path.join(TF_DIR, "terraform.tfvars.example")
        p = tf(d, "plan", "-input=false", "-lock=false", "-no-color", f"-var-file={example}")
        r.check("terraform accepts terraform.tfvars.example as it is", p.returncode == 0, p.stderr.strip()[-400:])
        for var, value in accepted:
            p = plan({var: value})
            r.check(f"terraform accepts {var} = {value!r}", p.returncode == 0, p.stderr.strip()[-300:])
        for var, value in bad:
            p = plan({var: value})
            r.check(f"terraform rejects {var} = {value!r}",
                    p.returncode != 0 and "Invalid value for variable" in p.stderr and f"var.{var}" in p.stderr,
                    (p.stderr or p.stdout).strip()[-300:])
        p = tf(d, "plan", "-input=false", "-lock=false", "-no-color",
               *sum((["-var", f"{k}={v}"] for k, v in good.items() if k != "allowed_ssh_cidr"), []))
        r.check("terraform refuses to run without allowed_ssh_cidr",
                p.returncode != 0 and "allowed_ssh_cidr" in p.stderr, p.stderr.strip()[-300:])


def check_outputs_with_terraform(r, cfg):
    """outputs.tf evaluated by terraform, with aws_instance.lab replaced by
    stand-ins that have the attributes the outputs read."""
    name = "terraform evaluates outputs.tf"
    if not shutil.which("terraform"):
        r.skip(name, "terraform not on PATH")
        return
    with open(os.path.join(TF_DIR, "outputs.tf"), encoding="utf-8") as f:
        outputs = f.read().replace("aws_instance.lab", "local.stand_in_instances")
    fixed = {k: cfg.locals[k] for k in ("certs_dir", "tls_port", "max_clients")}
    stub = "locals {\n" + "".join(f"  {k} = {json.dumps(v)}\n" for k, v in fixed.items()) + (
        '  stand_in_instances = [for i in range(var.instance_count) : '
        '{ public_ip = "198.51.100.${10 + i}", private_ip = "10.42.0.${10 + i}" }]\n}\n'
    )
    with tempfile.TemporaryDirectory(prefix="tf-outputs-") as d:
        shutil.copy(os.path.join(TF_DIR, "variables.tf"), d)
        with open(os.path.join(d, "outputs.tf"), "w", encoding="utf-8") as f:
            f.write(outputs)
        with open(os.path.join(d, "stand_in.tf"), "w", encoding="utf-8") as f:
            f.write(stub)
        init = tf(d, "init", "-backend=false", "-input=false", "-no-color")
        args = ["-var", "key_name=k", "-var", "allowed_ssh_cidr=203.0.113.7/32",
                "-var", "repo_url=https://github.com/example/secure-rdma.git",
                "-var", "instance_count=3", "-var", "ssh_private_key_path=~/.ssh/lab.pem"]
        ap = tf(d, "apply", "-auto-approve", "-input=false", "-lock=false", "-no-color", *args) \
            if init.returncode == 0 else init
        if not r.check("terraform applies outputs.tf against stand-in instances", ap.returncode == 0,
                       (ap.stderr or ap.stdout).strip()[-500:]):
            return
        out = json.loads(tf(d, "output", "-json").stdout)
        val = {k: v["value"] for k, v in out.items()}
        r.check("server_command output",
                val.get("server_command") ==
                "secure-server --listen 0.0.0.0:4433 --max-clients 10 --certs /opt/secure-rdma/certs",
                val.get("server_command"))
        r.check("client_commands output, one per client",
                val.get("client_commands") == {
                    f"client-{n}": f"secure-client 10.42.0.10 --port 4433 --certs /opt/secure-rdma/certs --name client-{n}"
                    for n in (1, 2)}, str(val.get("client_commands")))
        r.check("ssh_commands output uses the key path and the public IPs",
                val.get("ssh_commands", {}).get("client-2") ==
                "ssh -i ~/.ssh/lab.pem -o StrictHostKeyChecking=accept-new ubuntu@198.51.100.12",
                str(val.get("ssh_commands")))
        r.check("cert_copy_commands output copies ca.pem, client-N.pem and client-N.key with scp -3",
                val.get("cert_copy_commands", {}).get("client-1") ==
                "scp -3 -i ~/.ssh/lab.pem -o StrictHostKeyChecking=accept-new "
                "ubuntu@198.51.100.10:/opt/secure-rdma/certs/ca.pem "
                "ubuntu@198.51.100.10:/opt/secure-rdma/certs/client-1.pem "
                "ubuntu@198.51.100.10:/opt/secure-rdma/certs/client-1.key "
                "ubuntu@198.51.100.11:/opt/secure-rdma/certs/",
                str(val.get("cert_copy_commands")))
        r.check("IP outputs", val.get("server_private_ip") == "10.42.0.10"
                and val.get("client_public_ips") == {"client-1": "198.51.100.11", "client-2": "198.51.100.12"}
                and val.get("client_private_ips") == {"client-1": "10.42.0.11", "client-2": "10.42.0.12"})
        steps = val.get("lab_instructions", "")
        r.check("lab_instructions lists every step for every machine",
                steps.count("cloud-init status --wait") == 3 and steps.count("scp -3") == 2
                and "--name client-2" in steps and "secure-server --listen" in steps, steps)
        print("     lab_instructions as printed for 3 machines:")
        for line in steps.rstrip().splitlines():
            print(f"     | {line}")


def check_render_with_terraform(r, cfg, rendered):
    """The test renderer against terraform's own templatefile()."""
    name = "python renderer matches terraform templatefile()"
    if not shutil.which("terraform"):
        r.skip(name, "terraform not on PATH")
        return
    with tempfile.TemporaryDirectory(prefix="tf-render-") as d:
        shutil.copy(TEMPLATE, d)
        with open(os.path.join(d, "render.tf"), "w", encoding="utf-8") as f:
            for role in rendered:
                with open(os.path.join(d, f"{role}.json"), "w", encoding="utf-8") as v:
                    json.dump(sample_values(cfg, role), v)
                f.write(f'output "{role}" {{\n  value = templatefile("${{path.module}}/user_data.sh.tftpl", '
                        f'jsondecode(file("${{path.module}}/{role}.json")))\n}}\n')
        init = tf(d, "init", "-backend=false", "-input=false", "-no-color")
        ap = tf(d, "apply", "-auto-approve", "-input=false", "-lock=false", "-no-color") \
            if init.returncode == 0 else init
        if ap.returncode != 0:
            r.check(name, False, ap.stderr.strip()[-400:])
            return
        out = json.loads(tf(d, "output", "-json").stdout)
        for role, text in rendered.items():
            r.check(f"{name} ({role})", out.get(role, {}).get("value") == text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render-dir", help="write rendered user_data here")
    args = ap.parse_args()
    if args.render_dir:
        os.makedirs(args.render_dir, exist_ok=True)

    r = Results()
    cfg = check_parse(r)
    check_provider(r, cfg)
    check_variables(r, cfg)
    check_network(r, cfg)
    check_instances(r, cfg)
    check_tags(r, cfg)
    check_no_secrets(r)
    check_checkov_skips(r)
    check_tfvars_example(r, cfg)
    check_outputs(r, cfg)
    rendered = check_template(r, cfg, args.render_dir)
    check_scripts(r)
    check_validation_with_terraform(r)
    check_outputs_with_terraform(r, cfg)
    if rendered:
        check_render_with_terraform(r, cfg, rendered)

    print(f"{r.passed} passed, {r.failed} failed, {r.skipped} skipped")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
