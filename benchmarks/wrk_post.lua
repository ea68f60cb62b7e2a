-- Part of the MNIST example: a project generated without it has no such file.
-- wrk's script for benchmarks/serving.py: POST the bodies <folder>/00000.body, 00001.body, ... in turn
-- (each connection from its own start), and print the round's figures as one line of JSON.
-- wrk -s wrk_post.lua <url> -- <folder> <count> <content type>
local requests, next = {}, 0

function init(args)
  for n = 0, tonumber(args[2]) - 1 do
    local file = assert(io.open(string.format("%s/%05d.body", args[1], n), "rb"))
    requests[#requests + 1] = wrk.format("POST", "/predict", { ["Content-Type"] = args[3] }, file:read("*a"))
    file:close()
  end
end

function request()
  next = next % #requests + 1
  return requests[next]
end

function done(summary, latency, _)
  local errors = summary.errors
  io.write(string.format(
    '{"requests": %d, "seconds": %.6f, "p50_us": %d, "p99_us": %d, "failed": %d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    errors.status + errors.connect + errors.read + errors.write + errors.timeout
  ))
end
