-- post_bodies.lua with a pause of PAUSE_MS before each request: lookups at a steady pace beside other
-- work (bench/bulk_load.py), not as fast as the server answers.
--
--   wrk -t1 -c1 -dDs -s bench/lua/paced_bodies.lua URL -- BODIES_FILE PATH ROW_MARKER PAUSE_MS
--
-- Stopped early by SIGINT, wrk still runs done() and prints its WRK_JSON line.

local here = debug.getinfo(1, "S").source:sub(2):match("(.*/)") or "./"
dofile(here .. "post_bodies.lua")

local post_bodies_init = init
local pause_ms = nil

function init(args)
   pause_ms = tonumber(args[4])
   if pause_ms == nil or pause_ms < 0 then
      error("usage: wrk ... -s paced_bodies.lua URL -- BODIES_FILE PATH ROW_MARKER PAUSE_MS")
   end
   post_bodies_init(args)
end

function delay()
   return pause_ms
end
