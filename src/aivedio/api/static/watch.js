// The player page (/watch/{id}): plays one published revision through the playback gateway.
//
// Settings come from the JSON block #player-settings (the page allows no inline script):
// URLs of the master playlist (hls), the MP4 (mp4), poster, sprite thumbnails WebVTT
// (thumbnails_vtt) and waveform JSON (waveform), all under /media/{token}/.
//
// Playback: hls.js where Media Source Extensions exist, native HLS where the browser plays it,
// else the MP4. window.aivedioPlayer reports what happened (tests read it):
//   mode          "hls.js" | "native-hls" | "mp4" | null
//   hlsAttached   hls.js attached to the video element (also <video data-hls-attached="true">)
//   errors        what went wrong (fatal playback errors, failed loads, script errors)
//   notes         what is worth knowing but not an error (recovered hls.js errors, autoplay)
//   thumbnails    number of sprite cues parsed; waveform: true once drawn
//   codec         the ladder hls.js plays: "av1" or "h264" (null before the manifest)
//   av1Supported  whether Media Source said it decodes the master's AV1 renditions (null:
//                 the master has none)
//   playingCodec  the video codec of the level hls.js last switched to
//
// Codec choice: a master may list an AV1 ladder beside the H.264 one. The AV1 renditions
// are kept only when MediaSource.isTypeSupported('video/mp4; codecs="av01…"') says yes for
// them; then the H.264 ones are removed (hls.js never switches codec mid-stream), else the
// AV1 ones are. H.264 is the fallback every browser plays. An HDR10 rendition
// (VIDEO-RANGE=PQ) is kept only where the display says it shows high dynamic range
// (matchMedia "(dynamic-range: high)"): elsewhere its picture would look washed out.
//   hdrDisplay    what that query answered
(function () {
  "use strict";

  var state = {
    mode: null,
    hlsJs: typeof window.Hls === "function",
    hlsAttached: false,
    codec: null,
    av1Supported: null,
    playingCodec: null,
    hdrDisplay: false,
    levels: [],
    manifestParsed: false,
    errors: [],
    notes: [],
    thumbnails: 0,
    waveform: false,
  };
  window.aivedioPlayer = state;

  var $ = function (id) {
    return document.getElementById(id);
  };
  var video = $("player-video");
  var timeline = $("player-timeline");
  var canvas = $("player-waveform");
  var played = $("player-played");
  var buffered = $("player-buffered");
  var preview = $("player-preview");
  var previewImage = $("player-preview-image");
  var previewTime = $("player-preview-time");
  var playButton = $("player-play");
  var muteButton = $("player-mute");
  var clock = $("player-clock");
  var modeLabel = $("player-mode");
  var statusLine = $("player-status");

  function fail(message) {
    state.errors.push(String(message));
    statusLine.textContent = String(message);
  }

  window.addEventListener("error", function (event) {
    fail("script error: " + (event.message || "unknown"));
  });
  window.addEventListener("unhandledrejection", function (event) {
    fail("unhandled rejection: " + String(event.reason));
  });
  document.addEventListener("securitypolicyviolation", function (event) {
    fail("refused by the page's policy: " + event.violatedDirective + " " + event.blockedURI);
  });

  var settings;
  try {
    settings = JSON.parse($("player-settings").textContent);
  } catch (err) {
    fail("the page's settings are unreadable: " + err);
    return;
  }

  // -- playback -------------------------------------------------------------------------------

  function setMode(mode) {
    state.mode = mode;
    document.documentElement.setAttribute("data-player-mode", mode);
    modeLabel.textContent = { "hls.js": "HLS (hls.js)", "native-hls": "HLS", mp4: "MP4" }[mode];
  }

  function start() {
    var promise = video.play();
    if (promise && typeof promise.catch === "function") {
      promise.catch(function (err) {
        state.notes.push("autoplay refused: " + (err && err.name));
      });
    }
  }

  function playMp4(reason) {
    if (!settings.mp4) {
      fail(reason + "; no MP4 to fall back to");
      return;
    }
    if (reason) state.notes.push(reason + "; playing the MP4");
    setMode("mp4");
    video.src = settings.mp4;
    start();
  }

  function isAv1(level) {
    return /^av01\./.test(level.videoCodec || "");
  }

  function mediaSourceSays(codec) {
    var source = window.ManagedMediaSource || window.MediaSource;
    if (!source || typeof source.isTypeSupported !== "function") return false;
    return source.isTypeSupported('video/mp4; codecs="' + codec + '"');
  }

  function hdrDisplay() {
    return (
      typeof window.matchMedia === "function" && window.matchMedia("(dynamic-range: high)").matches
    );
  }

  // The indexes of the levels to drop: the AV1 ones the browser decodes are kept, and then
  // only they; otherwise every AV1 level goes and the H.264 ladder stays.
  function levelsToDrop(levels) {
    var av1 = [];
    var decodable = [];
    var hdr = hdrDisplay();
    state.hdrDisplay = hdr;
    levels.forEach(function (level, index) {
      if (!isAv1(level)) return;
      av1.push(index);
      var shown = hdr || (level.videoRange || "SDR") === "SDR";
      if (shown && mediaSourceSays(level.videoCodec)) decodable.push(index);
    });
    state.av1Supported = av1.length ? decodable.length > 0 : null;
    state.codec = decodable.length ? "av1" : "h264";
    var drop = levels
      .map(function (_level, index) {
        return index;
      })
      .filter(function (index) {
        return decodable.length ? decodable.indexOf(index) < 0 : av1.indexOf(index) >= 0;
      });
    state.levels = levels
      .filter(function (_level, index) {
        return drop.indexOf(index) < 0;
      })
      .map(function (level) {
        return { codec: level.videoCodec, range: level.videoRange || "SDR", height: level.height };
      });
    return drop;
  }

  function playWithHlsJs() {
    var Hls = window.Hls;
    // The page's <track> elements show the captions; hls.js would take their text tracks
    // over (and clear their cues) for the master playlist's SUBTITLES group. Loading starts
    // once the levels of one codec are chosen (MANIFEST_PARSED below).
    var config = { enableWebVTT: false, autoStartLoad: false };
    // On an HDR display hls.js starts on the HDR10 rendition where the master has one.
    if (hdrDisplay()) config.videoPreference = { preferHDR: true };
    if (settings.hls_worker) config.workerPath = settings.hls_worker;
    else config.enableWorker = false; // an inline worker is a blob:, which the policy refuses
    var hls = new Hls(config);
    var mediaRecovered = false;
    var networkRetried = false;
    setMode("hls.js");
    hls.on(Hls.Events.MEDIA_ATTACHED, function () {
      state.hlsAttached = true;
      video.setAttribute("data-hls-attached", "true");
    });
    hls.on(Hls.Events.MANIFEST_PARSED, function (_event, data) {
      var drop = levelsToDrop(data.levels);
      if (drop.length < data.levels.length) {
        // Highest index first: each removal renumbers the levels after it.
        drop.reverse().forEach(function (index) {
          hls.removeLevel(index);
        });
      }
      state.manifestParsed = true;
      hls.startLoad();
      start();
    });
    hls.on(Hls.Events.LEVEL_SWITCHED, function (_event, data) {
      var level = hls.levels[data.level];
      state.playingCodec = level ? level.videoCodec || null : null;
    });
    hls.on(Hls.Events.ERROR, function (_event, data) {
      var what = "hls.js " + data.type + ": " + data.details;
      if (!data.fatal) {
        state.notes.push(what);
        return;
      }
      if (data.type === Hls.ErrorTypes.MEDIA_ERROR && !mediaRecovered) {
        mediaRecovered = true;
        state.notes.push(what + " (recovering)");
        hls.recoverMediaError();
        return;
      }
      if (data.type === Hls.ErrorTypes.NETWORK_ERROR && !networkRetried && state.manifestParsed) {
        networkRetried = true;
        state.notes.push(what + " (retrying)");
        hls.startLoad();
        return;
      }
      state.errors.push(what);
      hls.destroy();
      state.hlsAttached = false;
      video.removeAttribute("data-hls-attached");
      playMp4(what);
    });
    hls.loadSource(settings.hls);
    hls.attachMedia(video);
  }

  function play() {
    video.muted = true; // autoplay is allowed muted
    if (settings.hls && state.hlsJs && window.Hls.isSupported()) {
      playWithHlsJs();
    } else if (settings.hls && video.canPlayType("application/vnd.apple.mpegurl")) {
      setMode("native-hls");
      video.src = settings.hls;
      start();
    } else if (settings.mp4) {
      playMp4(settings.hls ? "this browser cannot play HLS here" : "");
    } else {
      fail("this revision has nothing this browser can play");
    }
  }

  video.addEventListener("error", function () {
    var error = video.error;
    if (state.mode === "hls.js") return; // hls.js reports its own errors
    fail("the video cannot be played (" + state.mode + ", code " + (error && error.code) + ")");
    if (state.mode === "native-hls") playMp4("native HLS failed");
  });

  // -- controls -------------------------------------------------------------------------------

  function duration() {
    return isFinite(video.duration) && video.duration > 0 ? video.duration : 0;
  }

  function formatTime(seconds) {
    var s = Math.max(0, Math.floor(seconds || 0));
    var h = Math.floor(s / 3600);
    var m = Math.floor((s % 3600) / 60);
    var ss = String(s % 60).padStart(2, "0");
    return h ? h + ":" + String(m).padStart(2, "0") + ":" + ss : m + ":" + ss;
  }

  function refresh() {
    var total = duration();
    var fraction = total ? Math.min(1, video.currentTime / total) : 0;
    played.style.width = fraction * 100 + "%";
    var end = 0;
    for (var i = 0; i < video.buffered.length; i++) {
      if (video.buffered.start(i) <= video.currentTime + 0.5) end = video.buffered.end(i);
    }
    buffered.style.width = total ? Math.min(1, end / total) * 100 + "%" : "0";
    clock.textContent = formatTime(video.currentTime) + " / " + formatTime(total);
    timeline.setAttribute("aria-valuemax", String(Math.round(total)));
    timeline.setAttribute("aria-valuenow", String(Math.round(video.currentTime)));
    timeline.setAttribute("aria-valuetext", formatTime(video.currentTime));
    playButton.textContent = video.paused ? "Play" : "Pause";
    muteButton.textContent = video.muted ? "Unmute" : "Mute";
  }

  ["timeupdate", "progress", "play", "pause", "volumechange", "loadedmetadata"].forEach(
    function (name) {
      video.addEventListener(name, refresh);
    },
  );
  video.addEventListener("durationchange", function () {
    refresh();
    drawWaveform();
  });

  playButton.addEventListener("click", function () {
    if (video.paused) start();
    else video.pause();
  });
  muteButton.addEventListener("click", function () {
    video.muted = !video.muted;
  });

  function fractionAt(clientX) {
    var box = timeline.getBoundingClientRect();
    return box.width ? Math.min(1, Math.max(0, (clientX - box.left) / box.width)) : 0;
  }

  function seekTo(fraction) {
    var total = duration();
    if (total) video.currentTime = fraction * total;
  }

  var dragging = false;
  timeline.addEventListener("pointerdown", function (event) {
    dragging = true;
    timeline.setPointerCapture(event.pointerId);
    seekTo(fractionAt(event.clientX));
    showPreview(fractionAt(event.clientX));
  });
  timeline.addEventListener("pointermove", function (event) {
    var fraction = fractionAt(event.clientX);
    showPreview(fraction);
    if (dragging) seekTo(fraction);
  });
  timeline.addEventListener("pointerup", function () {
    dragging = false;
  });
  timeline.addEventListener("pointerleave", function () {
    if (!dragging) preview.hidden = true;
  });
  timeline.addEventListener("keydown", function (event) {
    var step = { ArrowLeft: -5, ArrowRight: 5 }[event.key];
    if (step && duration()) {
      video.currentTime = Math.min(duration(), Math.max(0, video.currentTime + step));
      event.preventDefault();
    } else if (event.key === " " || event.key === "k") {
      playButton.click();
      event.preventDefault();
    }
  });

  // -- sprite thumbnails (WebVTT cues "sprites/sheet.jpg#xywh=x,y,w,h") -----------------------

  var cues = [];

  function parseTimestamp(text) {
    var m = /^(?:(\d+):)?(\d{1,2}):(\d{2})\.(\d{3})$/.exec(text.trim());
    if (!m) return NaN;
    return Number(m[1] || 0) * 3600 + Number(m[2]) * 60 + Number(m[3]) + Number(m[4]) / 1000;
  }

  function parseThumbnails(text, base) {
    var found = [];
    var blocks = text.replace(/\r\n?/g, "\n").split(/\n{2,}/);
    blocks.forEach(function (block) {
      var lines = block.split("\n");
      var at = lines.findIndex(function (line) {
        return line.indexOf("-->") >= 0;
      });
      if (at < 0 || at + 1 >= lines.length) return;
      var times = lines[at].split("-->");
      var start = parseTimestamp(times[0]);
      var end = parseTimestamp(times[1].trim().split(/\s+/)[0]);
      var payload = lines[at + 1].trim();
      var hash = payload.indexOf("#xywh=");
      var file = hash < 0 ? payload : payload.slice(0, hash);
      var box = null;
      if (hash >= 0) {
        box = payload.slice(hash + 6).split(",").map(Number);
        if (box.length !== 4 || !box.every(isFinite)) box = null;
      }
      var url;
      try {
        url = new URL(file, base);
      } catch (err) {
        return;
      }
      if (url.origin !== window.location.origin || !isFinite(start) || !isFinite(end)) return;
      found.push({ start: start, end: end, url: url.href, box: box });
    });
    found.sort(function (a, b) {
      return a.start - b.start;
    });
    return found;
  }

  function cueAt(seconds) {
    var lo = 0;
    var hi = cues.length - 1;
    var best = null;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1;
      if (cues[mid].start <= seconds) {
        best = cues[mid];
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    return best;
  }

  function showPreview(fraction) {
    var total = duration();
    if (!total) return;
    var seconds = fraction * total;
    previewTime.textContent = formatTime(seconds);
    var cue = cueAt(seconds);
    if (cue && cue.box) {
      previewImage.hidden = false;
      previewImage.style.width = cue.box[2] + "px";
      previewImage.style.height = cue.box[3] + "px";
      previewImage.style.backgroundImage = 'url("' + cue.url + '")';
      previewImage.style.backgroundPosition = -cue.box[0] + "px " + -cue.box[1] + "px";
    } else {
      previewImage.hidden = true;
    }
    preview.hidden = false;
    var width = preview.offsetWidth;
    var box = timeline.getBoundingClientRect();
    var left = Math.min(box.width - width, Math.max(0, fraction * box.width - width / 2));
    preview.style.left = left + "px";
  }

  function loadThumbnails() {
    if (!settings.thumbnails_vtt) return;
    var base = new URL(settings.thumbnails_vtt, window.location.href);
    fetch(base.href, { credentials: "omit" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (text) {
        cues = parseThumbnails(text, base);
        state.thumbnails = cues.length;
      })
      .catch(function (err) {
        fail("thumbnails could not be loaded: " + err.message);
      });
  }

  // -- waveform (BBC audiowaveform JSON, version 2) --------------------------------------------

  var wave = null;

  function drawWaveform() {
    if (!wave) return;
    var ratio = window.devicePixelRatio || 1;
    var width = Math.max(1, Math.round(canvas.clientWidth * ratio));
    var height = Math.max(1, Math.round(canvas.clientHeight * ratio));
    canvas.width = width;
    canvas.height = height;
    var g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    g.fillStyle = window.getComputedStyle(canvas).color;
    var channels = wave.channels;
    var data = wave.data;
    var secondsPerPixel = wave.samples_per_pixel / wave.sample_rate;
    var total = duration() || wave.length * secondsPerPixel;
    var perColumn = total / width / secondsPerPixel; // waveform pixels per canvas column
    var range = wave.bits === 16 ? 32768 : 128;
    var middle = height / 2;
    for (var x = 0; x < width; x++) {
      var first = Math.floor(x * perColumn);
      var last = Math.max(first + 1, Math.floor((x + 1) * perColumn));
      if (first >= wave.length) break;
      var lo = 0;
      var hi = 0;
      for (var i = first; i < Math.min(last, wave.length); i++) {
        for (var c = 0; c < channels; c++) {
          var at = (i * channels + c) * 2;
          if (data[at] < lo) lo = data[at];
          if (data[at + 1] > hi) hi = data[at + 1];
        }
      }
      var top = middle - (hi / range) * middle;
      var bottom = middle - (lo / range) * middle;
      g.fillRect(x, top, 1, Math.max(1, bottom - top));
    }
    state.waveform = true;
  }

  function loadWaveform() {
    if (!settings.waveform) return;
    fetch(settings.waveform, { credentials: "omit" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.json();
      })
      .then(function (doc) {
        var ok =
          doc &&
          doc.version === 2 &&
          doc.channels >= 1 &&
          doc.sample_rate > 0 &&
          doc.samples_per_pixel > 0 &&
          Array.isArray(doc.data) &&
          doc.data.length >= doc.length * doc.channels * 2;
        if (!ok) throw new Error("not an audiowaveform version 2 document");
        wave = doc;
        drawWaveform();
      })
      .catch(function (err) {
        fail("the waveform could not be loaded: " + err.message);
      });
  }

  if (typeof window.ResizeObserver === "function") {
    new ResizeObserver(drawWaveform).observe(timeline);
  }

  refresh();
  play();
  loadThumbnails();
  loadWaveform();
})();
