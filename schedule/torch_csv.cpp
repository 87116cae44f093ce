// PyTorch's schedule CSV, both dialects (see torch_csv.h and docs/schedules.md).
#include "schedule/torch_csv.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "memory/error.h"
#include "memory/file_io.h"
#include "memory/utf8.h"
#include "schedule/detail/util.h"
#include "schedule/schedule_io.h"
#include "schedule/validate.h"

namespace baton::schedule {

namespace {

using K = ActionKind;

using detail::str;

// One cell's action before the dialect gives "B" its meaning.
struct Raw {
  std::string code;  // PyTorch's computation type: "F", "I", "B", "W", "SEND_F", ...
  int stage = -1;
  int micro_batch = -1;  // -1: none written
  bool overlap = false;  // the forward half of a composite; the next Raw is its partner
  int cell = 0;
};

struct Row {
  std::vector<Raw> actions;
  std::vector<KeptCell> kept;
};

// Splits one line into cells as Python's csv module reads them (',' separated, '"'
// quoting with "" for a quote). An empty line has no cells.
std::vector<std::string> split_cells(std::string_view line, const std::string& where) {
  std::vector<std::string> cells;
  if (line.empty()) return cells;
  size_t i = 0;
  while (true) {
    std::string cell;
    if (i < line.size() && line[i] == '"') {
      ++i;
      while (true) {
        if (i >= line.size()) throw InputError(where + ": a quoted cell is not closed");
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            cell += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        cell += line[i++];
      }
      if (i < line.size() && line[i] != ',')
        throw InputError(where + ": text after a quoted cell (expected ',')");
    } else {
      while (i < line.size() && line[i] != ',') cell += line[i++];
    }
    cells.push_back(std::move(cell));
    if (i >= line.size()) break;
    ++i;  // the ','
    if (i == line.size()) {
      cells.emplace_back();  // a trailing ',' ends with an empty cell
      break;
    }
  }
  return cells;
}

const char* const kTorchCodes[] = {"F",           "I",
                                   "B",           "W",
                                   "SEND_F",      "RECV_F",
                                   "SEND_B",      "RECV_B",
                                   "UNSHARD",     "RESHARD",
                                   "REDUCE_GRAD", "WAIT_SEND_F",
                                   "WAIT_SEND_B", "WAIT_REDUCE_GRAD"};

// "<stage><type><micro-batch>", as PyTorch's _Action.from_str reads it.
Raw parse_simple(std::string_view t, const std::string& where) {
  auto fail = [&](const std::string& why) -> Raw {
    throw InputError(where + ": bad action '" + brief(t) + "': " + why +
                     " (expected <stage><type><micro-batch> with type F, I, B, W, SEND_F, "
                     "RECV_F, SEND_B, RECV_B, REDUCE_GRAD; or (<action>;<action>)OVERLAP_F_B)");
  };
  size_t i = 0;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  size_t j = i;
  while (j < t.size() && (std::isupper(static_cast<unsigned char>(t[j])) || t[j] == '_')) ++j;
  Raw r;
  const std::string_view stage_text = t.substr(0, i);
  auto stage = detail::parse_index(stage_text);
  if (!stage) return fail("it does not start with a stage number");
  if (*stage > detail::kMaxIndex) return fail(detail::too_large("stage", stage_text));
  r.stage = int(*stage);
  r.code = std::string(t.substr(i, j - i));
  if (std::find(std::begin(kTorchCodes), std::end(kTorchCodes), r.code) == std::end(kTorchCodes))
    return fail("unknown type '" + r.code + "'");
  std::string_view mb = t.substr(j);
  if (!mb.empty()) {
    auto v = detail::parse_index(mb);
    if (!v) return fail("'" + std::string(mb) + "' is not a micro-batch number");
    if (*v > detail::kMaxIndex) return fail(detail::too_large("micro-batch", mb));
    r.micro_batch = int(*v);
  }
  const bool takes_mb = r.code != "UNSHARD" && r.code != "RESHARD" && r.code != "REDUCE_GRAD" &&
                        r.code != "WAIT_REDUCE_GRAD";
  if (takes_mb && r.micro_batch < 0) return fail("the micro-batch number is missing");
  if (!takes_mb && r.micro_batch >= 0) return fail(r.code + " takes no micro-batch");
  return r;
}

// PyTorch's runtime posts a receive at its RECV cell (an irecv) and waits for it at the
// action that uses the data; baton's RECV blocks until the data is there. Each RECV moves
// to just before its consumer on the rank (where add_transfers puts receives, both of a
// composite's before it), so baton waits where PyTorch does; the sends stay. A RECV with
// no consumer after it stays for the validator to name.
std::vector<Raw> place_receives(const std::vector<Raw>& a) {
  auto is_recv = [](const Raw& r) { return r.code == "RECV_F" || r.code == "RECV_B"; };
  // (0: forward, 1: backward; stage, micro-batch) -> the positions of the actions using it
  std::map<std::tuple<int, int, int>, std::vector<size_t>> users;
  for (size_t j = 0; j < a.size(); ++j) {
    const std::string& c = a[j].code;
    if (c == "F" || c == "B" || c == "I")
      users[{c == "F" ? 0 : 1, a[j].stage, a[j].micro_batch}].push_back(j);
  }
  std::vector<std::vector<size_t>> before(a.size());  // receives to put before action j
  std::vector<bool> moved(a.size(), false);
  for (size_t i = 0; i < a.size(); ++i) {
    if (!is_recv(a[i])) continue;
    auto it = users.find({a[i].code == "RECV_F" ? 0 : 1, a[i].stage, a[i].micro_batch});
    if (it == users.end()) continue;
    auto j = std::upper_bound(it->second.begin(), it->second.end(), i);
    if (j == it->second.end()) continue;
    const size_t at = *j > 0 && a[*j - 1].overlap ? *j - 1 : *j;  // a composite's start
    before[at].push_back(i);
    moved[i] = true;
  }
  std::vector<Raw> out;
  out.reserve(a.size());
  for (size_t j = 0; j < a.size(); ++j) {
    for (size_t i : before[j]) out.push_back(a[i]);
    if (!moved[j]) out.push_back(a[j]);
  }
  return out;
}

std::string torch_token(const Action& a, TorchDialect d, const std::string& where) {
  std::string code;
  switch (a.kind) {
    case K::forward:
      code = "F";
      break;
    case K::backward_input:
      code = d == TorchDialect::legacy ? "B" : "I";
      break;
    case K::backward_weight:
      code = "W";
      break;
    case K::full_backward:
      code = "B";
      break;
    case K::reduce_gradients:
      return str(a.stage) + "REDUCE_GRAD";
    case K::optimizer_step:
      throw InputError(where +
                       ": STEP has no PyTorch form (PyTorch's runtime steps the optimizer "
                       "outside the schedule); write the schedule before lowering it, or lower "
                       "it without the step (Python: lower(s, step=False))");
    default:
      code = std::string(kind_code(a.kind));  // SEND_F, RECV_F, SEND_B, RECV_B
  }
  return str(a.stage) + code + str(a.micro_batch);
}

}  // namespace

std::string_view dialect_name(TorchDialect d) {
  switch (d) {
    case TorchDialect::legacy:
      return "legacy";
    case TorchDialect::current:
      return "current";
    default:
      return "detect";
  }
}

TorchDialect parse_dialect(std::string_view name) {
  if (name == "legacy") return TorchDialect::legacy;
  if (name == "current") return TorchDialect::current;
  if (name == "detect" || name == "auto") return TorchDialect::detect;
  throw InputError("PyTorch CSV dialect: expected legacy, current or detect, found '" +
                   std::string(name) + "'");
}

bool is_csv_path(const std::string& path) {
  return detail::has_extension(path, ".csv");
}

TorchCsv parse_torch_csv(std::string_view text, const std::string& source, TorchDialect dialect,
                         const std::string& name) {
  text = memory::skip_utf8_bom(text);
  // Rows: one per line ("\r\n" or "\n"); the last line break ends the last row, and blank
  // lines after it (an editor's) are no ranks.
  for (;;) {
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
    const size_t nl = text.find_last_of('\n');
    const std::string_view last = nl == std::string_view::npos ? text : text.substr(nl + 1);
    if (nl == std::string_view::npos || last.find_first_not_of(" \t\r") != std::string_view::npos)
      break;
    text = text.substr(0, nl);  // a line of blanks after the rows
  }
  std::vector<Row> rows;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const int rank = int(rows.size());
    const std::string where = source + ": row " + str(rank + 1) + " (rank " + str(rank) + ")";
    Row row;
    const auto cells = split_cells(line, where);
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::string at = where + ", cell " + str(long(c) + 1);
      std::string_view t = detail::trim(cells[c]);
      if (t.empty()) {
        row.kept.push_back({int(c), cells[c]});
        continue;
      }
      if (t.front() == '(') {
        const size_t close = t.find(')');
        if (close == std::string_view::npos)
          throw InputError(at + ": bad composite '" + std::string(t) + "': no ')'");
        const std::string_view inner = t.substr(1, close - 1), type = t.substr(close + 1);
        if (type != "OVERLAP_F_B")
          throw InputError(at + ": composite '" + std::string(t) + "' of type '" +
                           std::string(type) + "' (baton knows OVERLAP_F_B only)");
        const size_t semi = inner.find(';');
        if (semi == std::string_view::npos || inner.find(';', semi + 1) != std::string_view::npos)
          throw InputError(at + ": composite '" + std::string(t) +
                           "': expected two actions, (<forward>;<backward>)");
        Raw f = parse_simple(detail::trim(inner.substr(0, semi)), at);
        Raw b = parse_simple(detail::trim(inner.substr(semi + 1)), at);
        if (f.code != "F" || (b.code != "B" && b.code != "I"))
          throw InputError(at + ": composite '" + std::string(t) +
                           "': expected a forward then a backward (F;B) or (F;I)");
        f.overlap = true;
        f.cell = b.cell = int(c);
        row.actions.push_back(f);
        row.actions.push_back(b);
        continue;
      }
      Raw r = parse_simple(t, at);
      if (r.code.rfind("WAIT_", 0) == 0) {
        row.kept.push_back({int(c), cells[c]});
        continue;
      }
      if (r.code == "UNSHARD" || r.code == "RESHARD")
        throw InputError(at + ": '" + std::string(t) +
                         "': UNSHARD/RESHARD (FSDP's gathering and freeing of a stage's "
                         "parameters) have no baton form: baton keeps every stage's parameters "
                         "on its rank. Dump the schedule compute-only (format=\"compute_only\") "
                         "or without FSDP");
      r.cell = int(c);
      row.actions.push_back(r);
    }
    row.actions = place_receives(row.actions);
    rows.push_back(std::move(row));
  }
  if (rows.empty())
    throw InputError(source + ": empty file (expected one row of actions per rank)");

  // The dialect.
  bool has_i = false, has_w = false, has_overlap = false;
  for (const Row& row : rows)
    for (const Raw& r : row.actions) {
      has_i = has_i || r.code == "I";
      has_w = has_w || r.code == "W";
      has_overlap = has_overlap || r.overlap;
    }
  if (dialect == TorchDialect::detect)
    dialect = has_i || has_overlap ? TorchDialect::current
              : has_w              ? TorchDialect::legacy
                                   : TorchDialect::current;
  // Legacy: a B of a pair with a W is the input gradient, of one without the full backward.
  std::set<std::pair<int, int>> with_w;
  if (dialect == TorchDialect::legacy)
    for (const Row& row : rows)
      for (const Raw& r : row.actions)
        if (r.code == "W") with_w.insert({r.stage, r.micro_batch});

  TorchCsv out;
  out.dialect = dialect;
  Schedule& s = out.schedule;
  s.name = name;
  s.num_ranks = int(rows.size());
  std::map<int, int> stage_rank;  // stage -> the rank that first named it
  std::map<int, std::string> stage_where;
  int max_stage = -1, max_mb = -1;
  for (int rank = 0; rank < int(rows.size()); ++rank) {
    std::vector<Action> list;
    std::vector<int> cells;
    for (const Raw& r : rows[size_t(rank)].actions) {
      const std::string at =
          source + ": row " + str(rank + 1) + " (rank " + str(rank) + "), cell " + str(r.cell + 1);
      Action a;
      a.stage = r.stage;
      a.micro_batch = r.micro_batch;
      a.overlap = r.overlap;
      if (r.code == "F") {
        a.kind = K::forward;
      } else if (r.code == "I") {
        if (dialect == TorchDialect::legacy)
          throw InputError(at +
                           ": 'I' (input gradient) is current PyTorch's; the legacy dialect "
                           "writes it 'B' (read with the current dialect)");
        a.kind = K::backward_input;
      } else if (r.code == "B") {
        a.kind = dialect == TorchDialect::current         ? K::full_backward
                 : with_w.count({r.stage, r.micro_batch}) ? K::backward_input
                                                          : K::full_backward;
      } else if (r.code == "W") {
        a.kind = K::backward_weight;
      } else if (r.code == "REDUCE_GRAD") {
        a.kind = K::reduce_gradients;
      } else {
        a.kind = *kind_from_code(r.code);  // the four transfers
      }
      if (r.overlap && dialect == TorchDialect::legacy)
        throw InputError(at + ": OVERLAP_F_B is current PyTorch's (read with the current dialect)");
      if (!is_transfer(a.kind)) {
        auto [it, fresh] = stage_rank.try_emplace(a.stage, rank);
        if (fresh) stage_where[a.stage] = at;
        if (it->second != rank)
          throw InputError(at + ": stage " + str(a.stage) + " is on rank " + str(rank) +
                           " here but on rank " + str(it->second) + " at " + stage_where[a.stage] +
                           " (a stage lives on one rank)");
      }
      max_stage = std::max(max_stage, a.stage);
      max_mb = std::max(max_mb, a.micro_batch);
      list.push_back(a);
      cells.push_back(r.cell);
    }
    s.ranks.push_back(std::move(list));
    out.kept.push_back(rows[size_t(rank)].kept);
    out.cells.push_back(std::move(cells));
  }
  for (int st = 0; st <= max_stage; ++st)
    if (!stage_rank.count(st))
      throw InputError(source + ": stage " + str(st) + " is named by no rank's compute (stages " +
                       "0 to " + str(max_stage) + " are used; each must live on some rank)");
  if (max_stage < 0) throw InputError(source + ": no compute actions");
  s.placement.resize(size_t(max_stage) + 1);
  for (auto [st, rank] : stage_rank) s.placement[size_t(st)] = rank;
  s.num_micro_batches = std::max(1, max_mb + 1);
  check_header(s, source);
  assign_peers(s);
  return out;
}

int torch_cell(const TorchCsv& csv, int rank, int index) {
  if (rank < 0 || rank >= int(csv.schedule.ranks.size())) return -1;
  const auto& list = csv.schedule.ranks[size_t(rank)];
  if (index < 0 || index >= int(list.size())) return -1;
  if (rank < int(csv.cells.size()) && csv.cells[size_t(rank)].size() == list.size())
    return csv.cells[size_t(rank)][size_t(index)];  // as read (a receive may have moved)
  const std::vector<KeptCell>* kept =
      rank < int(csv.kept.size()) ? &csv.kept[size_t(rank)] : nullptr;
  int cell = 0;
  size_t e = 0;
  auto skip_empty = [&] {
    while (kept && e < kept->size() && (*kept)[e].cell == cell) {
      ++cell;
      ++e;
    }
  };
  for (int i = 0;; ++i) {
    skip_empty();
    if (i == index) return cell;
    if (list[size_t(i)].overlap && i + 1 < int(list.size())) {
      if (i + 1 == index) return cell;
      ++i;
    }
    ++cell;
  }
}

void check_torch_csv(const TorchCsv& csv, const std::string& source) {
  const ValidationReport r = validate(csv.schedule);
  if (r.ok) return;
  std::string where;
  if (const int cell = torch_cell(csv, r.rank, r.index); cell >= 0)
    where = " (CSV row " + str(r.rank + 1) + ", cell " + str(cell + 1) + ")";
  else if (r.rank >= 0)
    where = " (CSV row " + str(r.rank + 1) + ")";
  throw InputError(source + ": invalid schedule" + where + ": " + r.to_string());
}

TorchCsv load_torch_csv(const std::string& path, TorchDialect dialect) {
  std::string name = path;
  if (size_t slash = name.find_last_of('/'); slash != std::string::npos)
    name = name.substr(slash + 1);
  if (is_csv_path(name)) name.resize(name.size() - 4);
  // The name goes into JSON (traces, the JSON form), which holds only UTF-8.
  return parse_torch_csv(memory::read_file(path), path, dialect,
                         memory::with_utf8_replacements(name));
}

std::string to_torch_csv(const Schedule& s, TorchDialect dialect, const KeptCells* kept) {
  if (dialect == TorchDialect::detect) dialect = TorchDialect::current;
  if (s.num_directions != 1)
    throw InputError("PyTorch CSV: a schedule of " + str(s.num_directions) +
                     " directions has no PyTorch form (its stages hold model replicas)");
  if (kept && kept->size() != s.ranks.size())
    throw InputError("PyTorch CSV: kept cells given for " + str(long(kept->size())) +
                     " ranks, the schedule has " + str(long(s.ranks.size())));
  std::string out;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    const auto& list = s.ranks[r];
    const std::vector<KeptCell> none;
    const std::vector<KeptCell>& empty = kept ? (*kept)[r] : none;
    // What parse_torch_csv keeps, in its order: blanks and waits at increasing cells.
    // Other text (a comma, a quote, a line break, an action) had been written into a file
    // parse_torch_csv refuses or reads otherwise, a negative cell put first.
    for (size_t k = 0; k < empty.size(); ++k) {
      const std::string at =
          "kept cells: rank " + str(long(r)) + ", cell " + str(long(empty[k].cell));
      if (empty[k].cell < 0 || (k > 0 && empty[k].cell <= empty[k - 1].cell))
        throw InputError(at + ": expected cells in increasing order from 0" +
                         (k > 0 ? ", after cell " + str(long(empty[k - 1].cell)) : std::string()));
      const std::string_view t = detail::trim(empty[k].text);
      bool wait = false;
      if (!t.empty() && t.find_first_of(",\"\r\n") == std::string_view::npos) {
        try {
          wait = parse_simple(t, at).code.rfind("WAIT_", 0) == 0;
        } catch (const InputError&) {
        }
      }
      if (!t.empty() && !wait)
        throw InputError(at +
                         ": expected a blank or a wait such as 0WAIT_SEND_F3 (what "
                         "parse_csv keeps), found '" +
                         brief(printable(empty[k].text)) + "'");
    }
    // PyTorch's runtime refuses a REDUCE_GRAD without its WAIT_REDUCE_GRAD: the kept
    // waits are matched per stage, and a REDUCE_GRAD without one gets it right after
    // (`extra` such cells shift the kept cells' positions).
    std::map<int, int> waits;
    for (const KeptCell& k : empty) {
      const std::string_view t = detail::trim(k.text);
      const std::string_view code = "WAIT_REDUCE_GRAD";
      if (t.size() > code.size() && t.substr(t.size() - code.size()) == code)
        if (auto stage = detail::parse_index(t.substr(0, t.size() - code.size())))
          ++waits[int(*stage)];
    }
    int extra = 0;
    std::vector<std::string> cells;
    size_t i = 0, e = 0;
    while (i < list.size() || e < empty.size()) {
      if (e < empty.size() && i >= list.size() && empty[e].cell + extra > int(cells.size()))
        throw InputError("kept cells: rank " + str(long(r)) + ", cell " + str(long(empty[e].cell)) +
                         ": past the row's end (its actions and kept cells fill cells 0 to " +
                         str(long(cells.size()) - 1 - extra) + ")");
      if (e < empty.size() && (empty[e].cell + extra <= int(cells.size()) || i >= list.size())) {
        cells.push_back(empty[e].text);
        ++e;
        continue;
      }
      const std::string where = "PyTorch CSV: rank " + str(long(r)) + ", action " + str(long(i)) +
                                " (" + to_token(list[i]) + ")";
      if (list[i].overlap && i + 1 < list.size()) {
        if (dialect == TorchDialect::legacy)
          throw InputError(where +
                           ": a composite OVERLAP_F_B has no legacy form (write the "
                           "current dialect)");
        cells.push_back("(" + torch_token(list[i], dialect, where) + ";" +
                        torch_token(list[i + 1], dialect, where) + ")OVERLAP_F_B");
        i += 2;
        continue;
      }
      cells.push_back(torch_token(list[i], dialect, where));
      if (list[i].kind == K::reduce_gradients && waits[list[i].stage]-- <= 0) {
        cells.push_back(str(list[i].stage) + "WAIT_REDUCE_GRAD");
        ++extra;
      }
      ++i;
    }
    if (cells.size() == 1 && cells[0].empty()) {
      out += "\"\"";
    } else {
      for (size_t c = 0; c < cells.size(); ++c) out += (c ? "," : "") + cells[c];
    }
    out += "\r\n";
  }
  return out;
}

}  // namespace baton::schedule
