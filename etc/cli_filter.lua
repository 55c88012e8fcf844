--[[
slurm-snap cli_filter: make --snapshot-on-preempt alone deliver SIGUSR1 at
preemption.

Slurm sends a job's --signal to its tasks at preemption only when the job has
one (with SlurmctldParameters=preempt_send_user_signal). A SPANK plugin cannot
set it and job_submit.lua cannot set warn_signal, but a cli_filter runs inside
sbatch/salloc/srun before the request is sent and may set options["signal"].

Install: CliFilterPlugins=lua in slurm.conf; write this file next to
slurm.conf (Slurm 22.05 reads <dir of slurm.conf>/cli_filter.lua) with
  slurm-snap config cli-filter etc/cli_filter.lua > /etc/slurm/cli_filter.lua
If the site already has a cli_filter.lua, call slurm_snap_apply(options)
from its slurm_cli_pre_submit. Runs under Lua 5.1 (what Debian's Slurm links).
--]]

-- Written by `slurm-snap config cli-filter` from slurm-snap.toml [protocol]
-- checkpoint_signal and grace (0: Slurm's default 60 s): edit the
-- configuration, not these lines (`slurm-snap doctor` compares them). At
-- preemption the signal is sent at once whatever the time; the time also
-- makes Slurm send it that many seconds before the job's time limit, a
-- chance to snapshot before the kill.
local SNAP_SIGNAL = "USR1"
local SNAP_SIGNAL_TIME = 60
-- Slurm 25.11+: also --requeue=expedite, so a preempted job may start again
-- the moment it is requeued (not cred_expire, default 120 s, later). Needs
-- SlurmctldParameters=enable_expedited_requeue (Slurm refuses the job
-- otherwise): `slurm-snap config cli-filter --expedite` writes true.
local SNAP_EXPEDITE = false

-- The SPANK plugin's name (plugin_name) and option, as cli_filter sees them.
local SNAP_PLUGIN = "slurm-snap"
local SNAP_OPTION = "snapshot-on-preempt"

-- Measured on Slurm 22.05: options.spank is keyed by plugin name, then option
-- name; a flag option reads "set" when given and "unset" when not (an option
-- with an argument reads its value).
local function snapshot_on_preempt_requested(options)
	local spank = options["spank"]
	if type(spank) ~= "table" then
		return false
	end
	local ours = spank[SNAP_PLUGIN]
	if type(ours) ~= "table" then
		return false
	end
	return ours[SNAP_OPTION] == "set"
end

-- Without --signal, 22.05 reports "0@0" (no signal, no time).
local function user_gave_signal(options)
	local s = options["signal"]
	return s ~= nil and s ~= "" and s ~= "0@0"
end

-- srun inside an allocation inherits the job's options through the
-- environment; the job already has its signal, a step needs none.
local function new_allocation(options)
	if options["type"] ~= "srun" then
		return true
	end
	return not (os and os.getenv and os.getenv("SLURM_JOB_ID"))
end

function slurm_snap_apply(options)
	if new_allocation(options) and snapshot_on_preempt_requested(options)
		and not user_gave_signal(options) then
		options["signal"] = SNAP_SIGNAL .. "@" .. SNAP_SIGNAL_TIME
	end
	-- Batch jobs only (expedite is a batch requeue); never over --no-requeue.
	if SNAP_EXPEDITE and options["type"] == "sbatch" and snapshot_on_preempt_requested(options)
		and options["requeue"] ~= "0" then
		options["requeue"] = "expedite"
	end
end

function slurm_cli_setup_defaults(options, early_pass)
	return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
	slurm_snap_apply(options)
	return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
	return slurm.SUCCESS
end
