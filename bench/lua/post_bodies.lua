-- wrk script of bench/pull_queries.py: POSTs JSON bodies read from a file, one body a line, cycling
-- through them in order (every connection of the one wrk thread takes the next line).
--
--   wrk -t1 -cN -dDs -s bench/lua/post_bodies.lua URL -- BODIES_FILE PATH ROW_MARKER
--
-- response() counts answers whose status is not 2xx (and keeps the first one's status and body start)
-- and, in 2xx bodies, the rows: occurrences of ROW_MARKER (plain text, e.g. '"user-', which each
-- returned row's key carries once). done() prints one line "WRK_JSON {...}" with the counts, requests,
-- duration, socket errors and latency percentiles (microseconds).

local requests = {}
local count = 0
local next_index = 0
local marker = nil

-- Read by done() through thread:get(); numbers and strings only.
responses = 0
non2xx = 0
rows = 0
first_error = ""

function init(args)
   local file, path = args[1], args[2]
   marker = args[3]
   if file == nil or path == nil or marker == nil or marker == "" then
      error("usage: wrk ... -s post_bodies.lua URL -- BODIES_FILE PATH ROW_MARKER")
   end
   local headers = { ["Content-Type"] = "application/json" }
   for line in io.lines(file) do
      if line ~= "" then
         count = count + 1
         requests[count] = wrk.format("POST", path, headers, line)
      end
   end
   if count == 0 then
      error("no bodies in " .. file)
   end
end

function request()
   next_index = next_index % count + 1
   return requests[next_index]
end

function response(status, headers, body)
   responses = responses + 1
   if status < 200 or status > 299 then
      non2xx = non2xx + 1
      if first_error == "" then
         first_error = tostring(status) .. " " .. string.sub(body or "", 1, 300)
      end
      return
   end
   if body == nil then
      return
   end
   local at = 1
   while true do
      local found = string.find(body, marker, at, true)
      if found == nil then
         break
      end
      rows = rows + 1
      at = found + #marker
   end
end

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

local function quote(text)
   local escaped = string.gsub(text, '[%c"\\\128-\255]', function(c)
      return string.format("\\u%04x", string.byte(c))
   end)
   return '"' .. escaped .. '"'
end

function done(summary, latency, _)
   local total = { responses = 0, non2xx = 0, rows = 0 }
   local first = ""
   for _, thread in ipairs(threads) do
      total.responses = total.responses + (thread:get("responses") or 0)
      total.non2xx = total.non2xx + (thread:get("non2xx") or 0)
      total.rows = total.rows + (thread:get("rows") or 0)
      local e = thread:get("first_error") or ""
      if first == "" then
         first = e
      end
   end
   local e = summary.errors
   local parts = {
      '"duration_us":' .. summary.duration,
      '"requests":' .. summary.requests,
      '"bytes":' .. summary.bytes,
      '"responses":' .. total.responses,
      '"non2xx":' .. total.non2xx,
      '"rows":' .. total.rows,
      '"errors":{"connect":' .. e.connect .. ',"read":' .. e.read .. ',"write":' .. e.write
         .. ',"status":' .. e.status .. ',"timeout":' .. e.timeout .. '}',
      '"latency_us":{"min":' .. latency.min .. ',"mean":' .. string.format("%.1f", latency.mean)
         .. ',"p50":' .. latency:percentile(50) .. ',"p90":' .. latency:percentile(90)
         .. ',"p99":' .. latency:percentile(99) .. ',"p99_9":' .. latency:percentile(99.9)
         .. ',"max":' .. latency.max .. '}',
      '"first_error":' .. quote(first),
   }
   io.write("WRK_JSON {" .. table.concat(parts, ",") .. "}\n")
end
