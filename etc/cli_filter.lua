--[[
slurm-snap cli_filter: make --snapshot-on-preempt alone deliver SIGUSR1 at
preemption, and --snapshot-before-timelimit=MARGIN deliver it MARGIN before
the job's time limit; warn when the job's own --signal=B:... would leave its
ranks without the signal.

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

-- The SPANK plugin's name (plugin_name) and options, as cli_filter sees them.
local SNAP_PLUGIN = "slurm-snap"
local SNAP_OPTION = "snapshot-on-preempt"
local SNAP_TIMELIMIT_OPTION = "snapshot-before-timelimit"

-- Measured on Slurm 22.05: options.spank is keyed by plugin name, then option
-- name; a flag option reads "set" when given and "unset" when not (an option
-- with an argument reads its value).
local function our_options(options)
	local spank = options["spank"]
	if type(spank) ~= "table" then
		return {}
	end
	local ours = spank[SNAP_PLUGIN]
	if type(ours) ~= "table" then
		return {}
	end
	return ours
end

local function snapshot_on_preempt_requested(options)
	return our_options(options)[SNAP_OPTION] == "set"
end

-- Seconds in a duration of slurm-snap's one grammar (slurm_snap/slurm/duration.py:
-- Slurm's clock forms MM:SS, HH:MM:SS, D-HH[:MM[:SS]], or counts with units
-- such as 90s, 5m, 1h30m, 2hours). The helper validates the value strictly
-- (sbatch fails on a bad one); this only reads a valid one; nil otherwise.
local UNIT_SECONDS = {w = 604800, week = 604800, weeks = 604800, d = 86400, day = 86400, days = 86400,
	h = 3600, hour = 3600, hours = 3600, m = 60, min = 60, minute = 60, minutes = 60,
	s = 1, sec = 1, second = 1, seconds = 1}

function slurm_snap_seconds(text)
	if type(text) ~= "string" then
		return nil
	end
	local d, rest = text:match("^(%d+)%-([%d:]+)$")
	if d then
		local h, m, s = rest:match("^(%d+):?(%d*):?(%d*)$")
		if not h then
			return nil
		end
		return ((tonumber(d) * 24 + tonumber(h)) * 60 + (tonumber(m) or 0)) * 60 + (tonumber(s) or 0)
	end
	local h, m, s = text:match("^(%d+):(%d+):(%d+)$")
	if h then
		return (tonumber(h) * 60 + tonumber(m)) * 60 + tonumber(s)
	end
	m, s = text:match("^(%d+):(%d+)$")
	if m then
		return tonumber(m) * 60 + tonumber(s)
	end
	local total, seen = 0, 0
	for count, unit in text:gmatch("(%d+)(%a+)") do
		if not UNIT_SECONDS[unit] then
			return nil
		end
		total = total + tonumber(count) * UNIT_SECONDS[unit]
		seen = seen + #count + #unit
	end
	if seen == 0 or seen ~= #text then
		return nil
	end
	return total
end

local function timelimit_margin(options)
	local value = our_options(options)[SNAP_TIMELIMIT_OPTION]
	if value == nil or value == "unset" or value == "" then
		return nil
	end
	return slurm_snap_seconds(value)
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

-- "B:USR1@60" (22.05 prints the flags before a colon: B batch shell only,
-- R reservation): B sends the signal to the batch shell alone.
local function batch_shell_only(signal)
	local flags = signal:match("^(%a+):")
	return flags ~= nil and flags:find("B") ~= nil
end

local function warn(text)
	io.stderr:write("slurm-snap: warning: " .. text .. "\n")
end

function slurm_snap_apply(options)
	if not new_allocation(options) then
		return
	end
	local margin = timelimit_margin(options)
	local preempt = snapshot_on_preempt_requested(options)
	if not preempt and margin == nil then
		return
	end
	-- Batch jobs only (expedite is a batch requeue); never over --no-requeue.
	-- A time-limit stop is requeued too, so it gains the same.
	if SNAP_EXPEDITE and options["type"] == "sbatch" and options["requeue"] ~= "0" then
		options["requeue"] = "expedite"
	end
	if user_gave_signal(options) then
		-- Measured on 22.05 and 24.11: with B: no rank gets the signal, at
		-- preemption or before the time limit (docs/client.md).
		if batch_shell_only(options["signal"]) then
			warn("--signal=" .. options["signal"] .. " signals only the batch shell: the ranks never get "
				.. "the checkpoint signal, so they cannot checkpoint before the snapshot. Give "
				.. "--signal without B: (e.g. --signal=" .. SNAP_SIGNAL .. "@" .. (margin or SNAP_SIGNAL_TIME)
				.. "), or no --signal at all")
		end
		return
	end
	-- At preemption Slurm signals at once whatever the time; the time is
	-- how long before the time limit it also signals.
	options["signal"] = SNAP_SIGNAL .. "@" .. (margin or SNAP_SIGNAL_TIME)
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
